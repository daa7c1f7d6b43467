"""Record llama.cpp's sentence embeddings of the catalogue's small models, for tests/test_embeddings.py.

    python bench/record_llamacpp_embeddings.py --llama-server PATH [--out tests/data/llamacpp_embeddings.json]

For each model and each pooling (mean, cls, last), starts llama-server with `--embedding --pooling P -fa off`
(flash attention off: it orders attention's sums differently from llama.cpp's default CPU path, which is the one
pyllm gives the bits of), posts the texts below to /v1/embeddings, and saves the vectors (normalized, as the
server returns them) with the model's name, the server's build and the token counts. CI then holds pyllm's
embeddings to them (cosine similarity) without needing llama.cpp. Not run in CI.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyllm import catalogue  # noqa: E402

MODELS = ["smollm2-135m-instruct", "gemma3-270m"]
POOLINGS = ["mean", "cls", "last"]
TEXTS = ["Hello world", "The capital of France is Paris.",
         "def reverse(s):\n    return s[::-1]\n", "Ünïcödé, emoji 🙂 and numbers 12345 in one line."]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def record(server: str, model: Path, pooling: str) -> dict:
    port = free_port()
    proc = subprocess.Popen([server, "-m", str(model), "--embedding", "--pooling", pooling, "-fa", "off", "-t", "2",
                             "-c", "2048", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        result = post(f"http://127.0.0.1:{port}/v1/embeddings", {"input": TEXTS})
        return {"vectors": [item["embedding"] for item in result["data"]],
                "prompt_tokens": result["usage"]["prompt_tokens"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True, help="path of llama.cpp's llama-server")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_embeddings.json")
    args = parser.parse_args()
    version = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
    out = {"texts": TEXTS, "llama_server": (version.stdout + version.stderr).strip().splitlines()[0:2], "models": {}}
    for name in MODELS:
        path = catalogue.resolve(name)
        out["models"][name] = {pooling: record(args.llama_server, path, pooling) for pooling in POOLINGS}
        print(f"{name}: {', '.join(POOLINGS)}", file=sys.stderr)
    args.out.write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
