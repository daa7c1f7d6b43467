"""One line for tests/arm64_install.sh: the active tier, a digest of every row's float32 logits of a prompt (16+
tokens, so a prompt's panel and tile kernels run) and the greedy continuation of another, through the installed
package's public API. Run the same on x86 and on aarch64: the lines after the tier must be equal.

    python tests/arm64_logits_digest.py MODEL.gguf
"""

import hashlib
import json
import sys

import numpy as np

from pyllm import Llama, kernels

llm = Llama(model_path=sys.argv[1], n_ctx=256, n_threads=2, verbose=False)
PROMPT = "The quick brown fox jumps over the lazy dog. In the beginning of the story, the hero of our tale"
tokens = llm.tokenize(PROMPT)
logits = np.ascontiguousarray(llm.logits(tokens), dtype=np.float32)
text = llm.create_completion("The capital of France is", max_tokens=16, temperature=0)["choices"][0]["text"]
digest = hashlib.sha256(logits.tobytes()).hexdigest()
print(f"tier {kernels.active_tier()} | {len(tokens)} tokens, logits sha256 {digest} | greedy {json.dumps(text)}")
