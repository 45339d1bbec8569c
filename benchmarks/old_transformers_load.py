"""Load a directory obliviate saved with transformers 4.45 (the version open-unlearning pins), in a venv of its own.

    python benchmarks/old_transformers_load.py [MODEL_DIR] [--venv DIR]

Without MODEL_DIR a tiny model is saved first (save_model: a BPE tokenizer trained here, a chat template and two
added special tokens). The venv (default: <tmp>/obliviate-transformers-4.45) is made once with
`pip install "transformers==4.45.*" jinja2` (no torch: tokenizers and configs load without it); the environment
this script runs in is not touched. In the venv: AutoTokenizer and AutoConfig on the directory, the token ids of a
few texts, the special tokens and the chat template; here, the same with the installed transformers. Prints both
and whether they agree; exit status 1 when they do not.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

SAMPLES = ["Who wrote the novel?", "<|user|> hello <|assistant|> the author was born in 1950</s>", "  spaced  out "]
CHAT = [{"role": "user", "content": "Where was the author born?"}]
PROBE = """
import json, sys
import transformers
from transformers import AutoConfig, AutoTokenizer
d, samples, chat = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(d)
out = {"transformers": transformers.__version__, "class": type(tok).__name__,
       "ids": [tok(t)["input_ids"] for t in samples], "special": tok.all_special_tokens,
       "chat_template": tok.chat_template,
       "chat": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) if tok.chat_template else None}
try:
    out["config"] = type(AutoConfig.from_pretrained(d)).__name__
except Exception as exc:
    out["config"] = f"failed: {exc}"
print(json.dumps(out))
"""


def old_python(directory: Path) -> Path:
    """The venv's python, the venv made (transformers 4.45 and jinja2 installed) when it is not there yet."""
    python = directory / "bin" / "python"
    if not python.is_file():
        print(f"making {directory} with transformers==4.45.* (once)")
        venv.create(directory, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "transformers==4.45.*", "jinja2"], check=True)
    return python


def tiny_saved(directory: Path) -> Path:
    from obliviate.data.synthetic import corpus_texts, make_world
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    tok = train_tokenizer(corpus_texts(make_world(10, seed=1, forget_percents=(10,))), vocab_size=512)
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    save_model(directory, tiny_llama(tok, hidden_size=16, num_layers=1, num_heads=2, seed=0), tok)
    return directory


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", help="a directory saved by obliviate (default: a tiny one saved now)")
    ap.add_argument("--venv", default=str(Path(tempfile.gettempdir()) / "obliviate-transformers-4.45"))
    args = ap.parse_args()
    model_dir = Path(args.model_dir) if args.model_dir else tiny_saved(Path(tempfile.mkdtemp()) / "model")
    argv = [str(model_dir), json.dumps(SAMPLES), json.dumps(CHAT)]
    old = subprocess.run([str(old_python(Path(args.venv))), "-c", PROBE, *argv], capture_output=True, text=True)
    if old.returncode != 0:
        print(f"transformers 4.45 could not load {model_dir}:\n{old.stderr.strip().splitlines()[-1]}")
        return 1
    new = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True)
    a, b = json.loads(old.stdout.strip().splitlines()[-1]), json.loads(new.stdout.strip().splitlines()[-1])
    for name, res in (("old", a), ("installed", b)):
        print(f"{name}: transformers {res['transformers']}, {res['class']}, config {res['config']}, "
              f"special {res['special']}, chat template {'yes' if res['chat_template'] else 'no'}")
    same = {k: a[k] == b[k] for k in ("ids", "special", "chat_template", "chat")}
    print("agree: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
