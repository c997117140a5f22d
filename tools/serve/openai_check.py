"""The `openai` Python client against a running `spot serve` (run by .ci/run).

Completions and chat, plain and streamed, `n` choices, a per-request method, concurrent
streams, and an error: every streamed text must equal the plain response for the same
request, choice i of a request with seed s must equal a request with seed s + i, and 16
concurrent streams must equal the same requests sent one at a time.

    python tools/serve/openai_check.py --url http://127.0.0.1:8000 --model sdar-tiny-code
"""

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai


def completion(client, model, prompt, **kw):
    r = client.completions.create(model=model, prompt=prompt, **kw)
    assert r.choices[0].finish_reason in ("stop", "length"), r
    return r


def streamed_completion(client, model, prompt, **kw):
    text, finish, ids = [], None, set()
    for chunk in client.completions.create(model=model, prompt=prompt, stream=True, **kw):
        ids.add(chunk.id)
        for c in chunk.choices:
            text.append(c.text or "")
            finish = c.finish_reason or finish
    assert len(ids) == 1, f"a stream changed its id: {ids}"
    assert finish in ("stop", "length"), finish
    return "".join(text)


def streamed_chat(client, model, messages, **kw):
    text = []
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, **kw
    )
    for chunk in stream:
        for c in chunk.choices:
            text.append(c.delta.content or "")
    return "".join(text)


def check(what, got, want):
    if got != want:
        print(f"FAIL {what}:\n  got:  {got!r}\n  want: {want!r}")
        sys.exit(1)
    print(f"ok   {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    model = args.model
    t0 = time.time()

    models = [m.id for m in client.models.list()]
    check("models.list", models, [model])

    prompt = "def add(a, b):"
    plain = completion(client, model, prompt, max_tokens=32, temperature=0, seed=0)
    text = plain.choices[0].text
    assert plain.usage.completion_tokens > 0 and plain.usage.prompt_tokens > 0, plain.usage
    check(
        "completions: streamed == plain",
        streamed_completion(client, model, prompt, max_tokens=32, temperature=0, seed=0),
        text,
    )

    many = completion(client, model, prompt, max_tokens=24, temperature=1.0, seed=3, n=2)
    for i in range(2):
        one = completion(client, model, prompt, max_tokens=24, temperature=1.0, seed=3 + i)
        check(f"n=2: choice {i} == seed {3 + i}", many.choices[i].text, one.choices[0].text)

    other = completion(
        client, model, prompt, max_tokens=24, extra_body={"spot": {"method": "blockspec"}}
    )
    base = completion(client, model, prompt, max_tokens=24)
    check("spot.method blockspec == the default method", other.choices[0].text, base.choices[0].text)

    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    assert chat.choices[0].message.role == "assistant"
    check(
        "chat: streamed == plain",
        streamed_chat(client, model, messages, max_tokens=24),
        chat.choices[0].message.content,
    )

    prompts = [f"def f{i}(x):\n    return x *" for i in range(16)]

    def seq(i):
        r = completion(client, model, prompts[i], max_tokens=16, temperature=1.0, seed=100 + i)
        return r.choices[0].text

    def par(i):
        return streamed_completion(
            client, model, prompts[i], max_tokens=16, temperature=1.0, seed=100 + i
        )

    want = [seq(i) for i in range(16)]
    t1 = time.time()
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(par, range(16)))
    check(f"16 concurrent streams == one at a time ({time.time() - t1:.1f} s)", got, want)

    try:
        client.completions.create(model="not-" + model, prompt="x", max_tokens=4)
        print("FAIL an unknown model was accepted")
        sys.exit(1)
    except openai.BadRequestError as e:
        check("unknown model: 400 naming `model`", (e.status_code, e.body["param"]), (400, "model"))
    try:
        client.completions.create(model=model, prompt="x", max_tokens=4, temperature=-1)
        print("FAIL a negative temperature was accepted")
        sys.exit(1)
    except openai.BadRequestError as e:
        check("negative temperature: 400", (e.status_code, e.body["param"]), (400, "temperature"))
    print(f"openai {openai.__version__}: all checks passed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
