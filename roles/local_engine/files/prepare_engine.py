# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Build the tiny local model; check a fresh vLLM installation and spare the engine's first start the work it repeats.

Usage: prepare_engine.py [--tiny-model DIR] [--check [--model DIR] [--architecture NAME]... [--lmcache]]

Runs with the engine's virtual environment (vLLM, torch, transformers and tokenizers come with it).

``--tiny-model DIR`` builds a tiny random-weight Llama and a locally trained BPE tokenizer into DIR, without any hub,
unless DIR already holds a config.json. The output is deterministic (fixed seeds; run it with PYTHONHASHSEED=0) and
written atomically: a half-built folder never appears. The weights are random, so the text is gibberish; prefix
caching, KV events and metrics are real.

``--check`` (right after the install, with the engine's VLLM_CACHE_ROOT):

* imports what the engine's processes import (the OpenAI server, the EngineCore, the CPU worker), so Python writes
  their bytecode once, here (vLLM is installed without bytecode); a failure here is the install's failure;
* with ``--lmcache``, imports what the LMCache server (``lmcache server``) and vLLM's LMCacheMPConnector import too;
* fills vLLM's model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) for the model's architectures (``--architecture``,
  and those in the config.json of ``--model`` or of the tiny model), with vLLM's own code. At its first start the
  server would otherwise inspect the model class in a Python process of its own
  (vllm/model_executor/models/registry.py ``_LazyRegisteredModel.inspect_model_cls``, "performed in another process
  to avoid initializing CUDA"): one more import of torch and vLLM, to write the same file. Here that runs in this
  process, which has imported both and initialises no accelerator. vLLM keys the file by a hash of the model
  module's source, so it is read only while it matches the installed code; an architecture vLLM does not register
  is left to the engine.

With both, the tiny model is built in a child process forked once torch, transformers and tokenizers are imported
(they are imported once, and the two jobs use both cores), while this process goes on importing vLLM.
Prints the vLLM version (``--check``), what was built and one line per architecture prepared.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import traceback

WORDS = (
    "the a an of to in on for with from by at as is are was be been cache block token prefix engine model "
    "event store remove query hit miss warm cold stream request response server client router index "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega red green blue black white one two three four five six seven eight nine ten "
    "data value key hash chain parent child node graph tree list map set queue stack time space memory"
).split()

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def corpus(lines=4000, seed=0):
    rng = random.Random(seed)
    for dummy in range(lines):
        words = [rng.choice(WORDS) for dummy in range(rng.randint(5, 30))]
        yield " ".join(words) + " " + " ".join(str(rng.randint(0, 99999)) for dummy in range(3))


def build_tiny(output):
    """The tiny random-weight Llama and its tokenizer, saved atomically into ``output``."""
    import torch  # pylint: disable=import-outside-toplevel
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # pylint: disable=import-outside-toplevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # pylint: disable=import-outside-toplevel

    special = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>",
                                        model_max_length=2048)
    tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=2048, bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)

    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tiny-model-", dir=parent)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if os.path.isdir(output):
            shutil.rmtree(output)
        os.rename(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print("built tiny model in %s" % output)


def architectures(model, named):
    found = list(named)
    config = os.path.join(model, "config.json") if model else None
    if config and os.path.isfile(config):
        with open(config) as handle:
            found.extend(json.load(handle).get("architectures") or [])
    return list(dict.fromkeys(found))


def check_lmcache():
    """Import what the LMCache server and vLLM's connector to it import (their bytecode written here, once)."""
    # pylint: disable=import-outside-toplevel,unused-import
    from importlib.metadata import version

    import lmcache.cli.main  # noqa: F401  the `lmcache` command
    import lmcache.v1.multiprocess.http_server  # noqa: F401  `lmcache server`: the HTTP front and the request server
    import lmcache.integration.vllm.lmcache_mp_connector  # noqa: F401  what vLLM's LMCacheMPConnector resolves to
    print("lmcache %s" % version("lmcache"))


def check(model, named, lmcache=False):
    """Import what the engine imports; fill vLLM's model-info cache for the model's architectures."""
    # What the engine imports: the server, then (in the EngineCore process) the engine core and the CPU worker.
    import vllm  # pylint: disable=import-outside-toplevel
    import vllm.entrypoints.openai.api_server  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import vllm.v1.engine.core  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import vllm.v1.worker.cpu_worker  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    from vllm.model_executor.models import registry  # pylint: disable=import-outside-toplevel
    print(vllm.__version__)
    if lmcache:
        check_lmcache()
    # The imports above are the check; what follows only spares the engine work, so a failure leaves it to the engine.
    for name in architectures(model, named):
        try:
            registry._run_in_subprocess = lambda fn: fn()  # pylint: disable=protected-access
            entry = registry.ModelRegistry.models.get(name)
            if entry is None:
                print("%s: not an architecture vLLM registers; left to the engine" % name)
                continue
            entry.inspect_model_cls()
        except Exception as exc:  # pylint: disable=broad-except
            print("%s: left to the engine (%s: %s)" % (name, type(exc).__name__, exc))
            continue
        print("%s: model info cached under %s" % (name, os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-model", metavar="DIR", help="build the tiny model here unless it holds a config.json")
    parser.add_argument("--check", action="store_true", help="import what the engine imports and fill vLLM's model-info cache")
    parser.add_argument("--model", metavar="DIR", help="with --check: the model folder (its config.json names the architectures)")
    parser.add_argument("--architecture", action="append", default=[], help="with --check: an architecture to prepare (repeatable)")
    parser.add_argument("--lmcache", action="store_true", help="with --check: import what the LMCache server and its vLLM connector import")
    args = parser.parse_args(argv[1:])
    tiny = args.tiny_model if args.tiny_model and not os.path.isfile(os.path.join(args.tiny_model, "config.json")) else None
    if not args.check:
        if tiny:
            build_tiny(tiny)
        return 0

    child = None
    if tiny:
        # Imported once for both jobs (nothing has run on them yet, so no thread pool is copied into the child).
        import torch  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        import tokenizers  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        import transformers  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        sys.stdout.flush()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                build_tiny(tiny)
                code = 0
            except BaseException:  # pylint: disable=broad-except
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # pylint: disable=protected-access
    try:
        check(args.model or args.tiny_model, args.architecture, lmcache=args.lmcache)
    finally:
        if child:
            status = os.waitpid(child, 0)[1]
    if child and status != 0:
        sys.stderr.write("building the tiny model in %s failed (status %d)\n" % (tiny, status))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
