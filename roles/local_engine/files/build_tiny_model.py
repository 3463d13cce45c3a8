# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Build a tiny random-weight Llama and a locally trained BPE tokenizer into one folder, without any hub.

Usage: build_tiny_model.py OUTPUT_DIR

Runs with the engine's virtual environment (transformers, tokenizers and torch come with vLLM).
The output is deterministic (fixed seeds) and written atomically: a half-built folder never appears.
The weights are random, so the text is gibberish; prefix caching, KV events and metrics are real.
"""

import os
import random
import shutil
import sys
import tempfile

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


def build(output):
    # Imported here so that `--help` works without the engine's environment.
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


def main(argv):
    if len(argv) != 2 or argv[1].startswith("-"):
        sys.stderr.write(__doc__)
        return 2
    build(argv[1])
    print("built tiny model in %s" % argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
