"""The fresh-process half of tests/test_hf_export.py: load exported folders with transformers alone and record
what they compute. Run as ``python tests/hf_load_check.py REQUEST.json OUT.pt`` with no regulargpt checkout on the
path; REQUEST.json names the folders, the repository root, the ids, prompt, documents and (context, continuation)
pairs. Everything is computed here, nothing compared: the test compares with our own model.

1. With ``regulargpt`` unimportable: each folder's tokenizer (AutoTokenizer, no remote code) encodes and decodes
   the documents; AutoModelForCausalLM.from_pretrained must fail with regulargpt's "install" message.
2. With the checkout importable: logits (with and without the cache), greedy generate, and lm-evaluation-harness
   style loglikelihoods (HFLM._loglikelihood_tokens: context ids + continuation ids, the continuation's summed
   log-probs and whether it is the greedy continuation; an empty context reads the eos id first).
"""

import json
import sys

sys.modules["regulargpt"] = None  # step 1: `import regulargpt` fails, as where the package is not installed

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

request = json.loads(open(sys.argv[1]).read())
out: dict = {"folders": []}  # one entry per request["folders"] entry (a folder may be loaded twice)
for folder in request["folders"]:
    tok = AutoTokenizer.from_pretrained(folder)
    docs = request["documents"]
    out["folders"].append({"doc_ids": [tok(d, add_special_tokens=False)["input_ids"] for d in docs],
                           "doc_text": [tok.decode(tok(d)["input_ids"]) for d in docs]})
try:
    AutoModelForCausalLM.from_pretrained(request["folders"][0], trust_remote_code=True)
    out["without_regulargpt"] = "loaded"
except ImportError as err:
    out["without_regulargpt"] = str(err)

del sys.modules["regulargpt"]  # step 2
sys.path.insert(0, request["root"])


def loglikelihood(model, tok, context: str, continuation: str) -> tuple[float, bool]:
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    context_ids = tok(context, add_special_tokens=False)["input_ids"] if context else [tok.eos_token_id]
    continuation_ids = whole[len(context_ids):] if context else whole
    ids = torch.tensor([(context_ids + continuation_ids)[:-1]])
    logprobs = model(ids).logits.log_softmax(-1)[0, -len(continuation_ids):]  # (n, V)
    target = torch.tensor(continuation_ids)
    return float(logprobs.gather(-1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


with torch.no_grad():
    for folder, policy, row in zip(request["folders"], request["depth_policies"], out["folders"]):
        kwargs = {"depth_policy": policy} if policy else {}
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kwargs)
        tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        for name, ids in request["ids"].items():
            ids = torch.tensor(ids)
            cached = model(ids)
            row[name] = cached.logits
            row[name + "_no_cache"] = model(ids, use_cache=False).logits
            row[name + "_cache"] = type(getattr(cached, "cache", getattr(cached, "past_key_values", None))).__name__
        prompt = tok(request["prompt"], return_tensors="pt")
        row["generated"] = model.generate(**prompt, do_sample=False, max_new_tokens=40)[0].tolist()
        row["loglikelihood"] = [loglikelihood(model, tok, c, x) for c, x in request["pairs"]]
torch.save(out, sys.argv[2])
