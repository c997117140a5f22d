#!/bin/bash
# Server forwards per generated token of SpecDiff-2 against draft-free decoding on an
# autoregressive folder: 8 concurrent chat requests (the first 8 GSM8K-test questions, T 0,
# 128 tokens) to `spot serve --method specdiff` (the folder's default drafter; EXTRA adds
# serve options, e.g. EXTRA="--k 1 --draft-tokens 8"), then the same requests with
# `spot.method: df`; forwards from /stats, texts compared.
#
#   tools/serve/ar_forwards.sh SPOT_BINARY OUT_DIR   (SmolLM2 folder: tools/setup_smollm2.sh)
set -u
BIN=$(realpath "$1"); OUT=$(realpath -m "$2"); PORT=${PORT:-18555}
cd "$(dirname "$0")/../.."  # the repository root (the prompts are ../shared/data)
mkdir -p $OUT
$BIN serve --model ${MODEL:-$HOME/.cache/spot-smollm2} --method specdiff --max-new-tokens 128 --port $PORT --max-batch 8 ${EXTRA:-} 2> $OUT/serve.err &
PID=$!
for i in $(seq 60); do curl -s localhost:$PORT/health >/dev/null && break; sleep 1; done
python3 - "$PORT" "$OUT" <<'PY'
import json, sys, time, threading, urllib.request
port, out = sys.argv[1], sys.argv[2]
qs = [json.loads(l)["question"] for l in open("../shared/data/gsm8k_test.jsonl")][:8]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=3600).read())
def stats():
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/stats").read())
res = {}
for method in ["specdiff", "df"]:
    before = stats()["forwards"]
    answers = [None] * 8
    def run(i):
        answers[i] = post("/v1/chat/completions", {"model": "spot-smollm2", "messages": [{"role": "user", "content": qs[i]}],
            "max_tokens": 128, "temperature": 0, "seed": 0, "spot": {"method": method}})
    t0 = time.time()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    wall = time.time() - t0
    fw = stats()["forwards"] - before
    toks = sum(a["usage"]["completion_tokens"] for a in answers)
    nfe = sum(a["spot"]["choices"][0]["nfe"] for a in answers)
    res[method] = {"server_forwards": fw, "tokens": toks, "forwards_per_token": fw / toks,
                   "requests_own_nfe": nfe, "wall_s": wall,
                   "texts": [a["choices"][0]["message"]["content"] for a in answers]}
    print(method, {k: v for k, v in res[method].items() if k != "texts"}, flush=True)
print("identical:", res["specdiff"]["texts"] == res["df"]["texts"])
print("ratio df/specdiff forwards per token:", res["df"]["forwards_per_token"] / res["specdiff"]["forwards_per_token"])
json.dump(res, open(f"{out}/ar_serve.json", "w"), indent=1)
PY
kill $PID
