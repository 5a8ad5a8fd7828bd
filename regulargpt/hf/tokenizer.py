"""The run's sentencepiece tokenizer as a ``tokenizers`` BPE that encodes and decodes exactly like it.

``AutoTokenizer.from_pretrained(DIR)`` then loads ``tokenizer.json`` offline, with no sentencepiece and no remote
code. The data pipeline trains byte-fallback BPE with identity normalisation and no dummy prefix
(:data:`regulargpt.data.tokenizer.TRAINER_SETTINGS`); for such a model sentencepiece's encoding is, on the whole
text (no pre-splitting: pieces may span spaces and newlines):

    symbols = the characters of text with " " → "▁"
    repeat: merge the adjacent pair whose concatenation is the highest-scoring NORMAL piece (leftmost on ties)
    symbols that are not pieces → their UTF-8 bytes as <0xXX> pieces

which is a ``tokenizers`` BPE whose merges are every split (left, right) of every NORMAL piece into two NORMAL
pieces, ranked by the merged piece's score, with ``byte_fallback``. Decoding is "▁" → " ", byte pieces → bytes,
nothing stripped. Worked example: pieces "d", "e", "f", "de", "def" (scores −1, −2, −3, −4, −5 after the
characters) give merges (d, e) then (de, f): "def" → one id, as sentencepiece gives.

Special tokens: ``<unk>``, ``</s>`` (eos: ends every document in the token shards; also the bos, since every
document in them follows one), ``<pad>`` and ``<s>`` (unused by the shards), none added when encoding, and
``split_special_tokens``: a text containing "</s>" is encoded as characters, as sentencepiece does, not as the eos
id.
"""

from __future__ import annotations

from pathlib import Path

from sentencepiece import sentencepiece_model_pb2
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, normalizers
from transformers import PreTrainedTokenizerFast

from regulargpt.data import DataError, Tokenizer

__all__ = ["bpe_merges", "fast_tokenizer", "save_hf_tokenizer"]

_NORMAL, _BPE = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL, sentencepiece_model_pb2.TrainerSpec.BPE


def _check_convertible(proto: sentencepiece_model_pb2.ModelProto, name: str) -> None:
    """DataError unless the model is the kind the data pipeline trains (see the module docstring)."""
    norm, trainer = proto.normalizer_spec, proto.trainer_spec
    problems = [what for what, bad in [
        ("model_type is not bpe", trainer.model_type != _BPE),
        ("byte_fallback is off", not trainer.byte_fallback),
        (f"normalization_rule_name is {norm.name!r}, not 'identity'", norm.name != "identity"),
        ("add_dummy_prefix is on", norm.add_dummy_prefix),
        ("remove_extra_whitespaces is on", norm.remove_extra_whitespaces),
        ("it has a custom normalisation table", bool(norm.precompiled_charsmap)),
    ] if bad]
    if problems:
        raise DataError(f"tokenizer {name}: {'; '.join(problems)}; only the byte-fallback BPE models that "
                        f"data_prep/prepare.py trains (regulargpt.data.tokenizer.TRAINER_SETTINGS) convert exactly "
                        f"to a Hugging Face tokenizer")


def bpe_merges(pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """Merges of the NORMAL pieces (piece, score), highest merged score first; ties by the ids of left, right.

    Example: [("a", -1), ("b", -2), ("ab", -3), ("abb", -4)] → [("a", "b"), ("ab", "b")]."""
    ids = {piece: i for i, (piece, _) in enumerate(pieces)}
    ranked = []
    for piece, score in pieces:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-score, ids[left], ids[right], left, right))
    return [(left, right) for *_, left, right in sorted(ranked)]


def fast_tokenizer(tok: Tokenizer) -> FastTokenizer:
    """The ``tokenizers`` equivalent of a sentencepiece model: same ids for every text, same text for every ids."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(tok.model_proto)
    _check_convertible(proto, str(tok.path or "<memory>"))
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    normal = [(p.piece, p.score) for p in proto.pieces if p.type == _NORMAL]
    unk = proto.pieces[proto.trainer_spec.unk_id].piece
    bpe = models.BPE(vocab=vocab, merges=bpe_merges(normal), unk_token=unk, fuse_unk=True, byte_fallback=True)
    fast = FastTokenizer(bpe)
    fast.normalizer = normalizers.Replace(" ", "▁")
    fast.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return fast


def save_hf_tokenizer(tok: Tokenizer, out: Path) -> PreTrainedTokenizerFast:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (and the sentencepiece model itself, as
    ``tokenizer.model``) into the folder `out` → the tokenizer ``AutoTokenizer`` will load from it."""
    sp = tok.sp
    eos = sp.id_to_piece(sp.eos_id())
    # bos = eos, as GPT-2 has it: in the token shards every document follows an eos and none starts with <s>, so a
    # tool that starts a text with bos (lm-evaluation-harness's loglikelihood prefix, generate from nothing) reads
    # what the model was trained on. <s> stays a special token (skipped when decoding with skip_special_tokens).
    special = {"unk_token": sp.id_to_piece(sp.unk_id()), "eos_token": eos, "bos_token": eos}
    if sp.bos_id() >= 0:
        special["additional_special_tokens"] = [sp.id_to_piece(sp.bos_id())]
    if sp.pad_id() >= 0:
        special["pad_token"] = sp.id_to_piece(sp.pad_id())
    hf = PreTrainedTokenizerFast(tokenizer_object=fast_tokenizer(tok), split_special_tokens=True,
                                 clean_up_tokenization_spaces=False, add_bos_token=False, add_eos_token=False,
                                 **special)
    hf.save_pretrained(str(out))
    (out / "tokenizer.model").write_bytes(tok.model_proto)
    return hf
