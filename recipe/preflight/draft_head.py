"""``ROLLOUT_SPECULATIVE=eagle3``: the EAGLE-3 head at ``DRAFT_MODEL_PATH`` checked against ``MODEL_PATH``.

A head made for another model, or one whose auxiliary layers the target cannot give, fails in vLLM only when the
first draft runs (a shape error in the head's ``fc``, minutes into a launch), or not at all: a draft vocabulary
without its map drafts the wrong tokens, which rejection sampling silently discards. What vLLM 0.24 does with a
head (``model_executor/models/llama_eagle3.py``, ``v1/spec_decode/llm_base_proposer.py``):

- the target returns its residual stream at each listed layer id (0: the embeddings, i: after layer i; ids
  ``0..num_hidden_layers``), each layer once and in layer order (``EagleModelMixin._maybe_add_hidden_state``), and the
  runner concatenates them (``gpu_model_runner.py``) into the head's ``fc``, whose input is ``target_hidden_size x
  num_aux_hidden_states`` wide. Without ids in the head's config vLLM takes ``(2, L // 2, L - 3)``, which collapses
  to two layers for a 4-layer model;
- a head without its own ``embed_tokens`` or ``lm_head`` uses the target's, so its ``hidden_size`` must be the
  target's (and its draft vocabulary the whole vocabulary, for a shared ``lm_head``);
- a draft vocabulary smaller than the target's maps draft id ``i`` to ``i + d2t[i]``; without ``d2t`` to ``i``;
- the head runs at the target's TP (``draft_tensor_parallel_size`` may only be 1 or it), sharding its attention
  heads and MLP like any vLLM layer.

Both formats vLLM loads are read: a plain EAGLE-3 ``config.json`` (``LlamaForCausalLMEagle3``,
``Eagle3LlamaForCausalLM``, ...) and the ``speculators`` format (``speculators_model_type: eagle3``, ``transformer_layer_config``). Tensor shapes
come from the safetensors headers (no torch import); a ``.bin``-only head gets the config checks alone.
"""
from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import select
from .knobs import ARR

VAR = "DRAFT_MODEL_PATH"
SPECULATORS_ARCH = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}  # vLLM's algos.py


@dataclass
class Head:
    """What vLLM reads of a head: its config (normalised across the two formats) and its tensors' shapes."""

    path: Path
    arch: str
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple | None  # None: vLLM's default for the target
    num_aux: int | None  # the fc's inputs as the config states them (None: len(aux_layer_ids), else 3)
    heads: int
    kv_heads: int
    intermediate_size: int
    layers: int
    shapes: dict[str, tuple[int, ...]] | None = None  # None: no safetensors
    d2t: list[int] | None = field(default=None, repr=False)

    def has(self, part: str) -> bool:
        return any(part in name for name in self.shapes or ())

    def shape(self, suffix: str) -> tuple[int, ...] | None:
        return next((s for n, s in (self.shapes or {}).items() if n.endswith(suffix)), None)


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM 0.24's ``SupportsEagle3.get_eagle3_default_aux_hidden_state_layers``."""
    return (2, num_layers // 2, num_layers - 3)


def _safetensors(path: Path) -> tuple[dict[str, tuple[int, ...]], list[int] | None]:
    """The tensors' shapes in every ``*.safetensors`` of ``path`` (their JSON headers), and ``d2t``'s values."""
    shapes, d2t = {}, None
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                shapes[name] = tuple(meta["shape"])
                if name == "d2t" and meta["dtype"] == "I64":
                    start, end = meta["data_offsets"]
                    f.seek(8 + n + start)
                    values = array("q", f.read(end - start))
                    if sys.byteorder == "big":
                        values.byteswap()
                    d2t = values.tolist()
    return shapes, d2t


def read_head(path: str | Path) -> Head:
    """The head at ``path``; ``ValueError`` names what is missing or unreadable."""
    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text())
    except OSError:
        raise ValueError(f"{VAR}={path} has no config.json: point it at an EAGLE-3 head's directory") from None
    except ValueError as e:
        raise ValueError(f"{VAR}={path}: config.json is not valid JSON ({e})") from None
    if "speculators_model_type" in raw:
        if raw["speculators_model_type"] != "eagle3":
            raise ValueError(f"{VAR}={path} is a speculators '{raw['speculators_model_type']}' model, not an "
                             "EAGLE-3 head (speculators_model_type: eagle3)")
        layer = dict(raw.get("transformer_layer_config") or {})
        model_type = layer.get("model_type", "llama")
        if model_type not in SPECULATORS_ARCH:
            raise ValueError(f"{VAR}={path}: vLLM 0.24 loads speculators EAGLE-3 heads of model_type llama or qwen3, "
                             f"not {model_type!r} (transformer_layer_config.model_type)")
        arch = SPECULATORS_ARCH[model_type]
        conf = {**layer, **{k: raw[k] for k in ("draft_vocab_size", "target_hidden_size",
                                                "eagle_aux_hidden_state_layer_ids") if raw.get(k) is not None}}
    else:
        conf = raw
        archs = raw.get("architectures") or ["?"]
        arch = next((a for a in archs if a.startswith("Eagle3") or a.endswith("Eagle3")), f"Eagle3{archs[0]}")
    ids = conf.get("eagle_aux_hidden_state_layer_ids") or (conf.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    try:
        hidden, vocab = int(conf["hidden_size"]), int(conf["vocab_size"])
        heads = int(conf["num_attention_heads"])
        head = Head(path=path, arch=arch, hidden_size=hidden,
                    target_hidden_size=int(conf.get("target_hidden_size") or hidden), vocab_size=vocab,
                    draft_vocab_size=int(conf.get("draft_vocab_size") or vocab),
                    aux_layer_ids=tuple(ids) if ids else None, num_aux=conf.get("num_aux_hidden_states"),
                    heads=heads, kv_heads=int(conf.get("num_key_value_heads") or heads),
                    intermediate_size=int(conf["intermediate_size"]), layers=int(conf.get("num_hidden_layers", 1)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{VAR}={path}: config.json lacks a usable {e} (an EAGLE-3 head's config names "
                         "hidden_size, vocab_size, num_attention_heads, intermediate_size)") from None
    if any(path.glob("*.safetensors")):
        head.shapes, head.d2t = _safetensors(path)
    return head


def vllm_knows(arch: str) -> bool | None:
    """Whether the installed vLLM's model registry names ``arch`` (read from its source, without importing vLLM);
    None without vLLM."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # a top-level find_spec imports nothing
    registry = Path(spec.origin).parent / "model_executor" / "models" / "registry.py" if spec and spec.origin else None
    if registry is None or not registry.is_file():
        return None
    return f'"{arch}":' in registry.read_text(encoding="utf-8")


def head_problems(head: Head, target: Mapping, tp: int) -> list[str]:
    """What does not fit between ``head`` and the target's (text) ``config.json`` at tensor parallel size ``tp``;
    each message names the head's and the model's values."""
    at = f"{VAR}={head.path}"
    out = []
    if vllm_knows(head.arch) is False:
        out.append(f"{at}: vLLM has no EAGLE-3 head {head.arch} (from config.json architectures); vLLM 0.24 runs "
                   "Llama-, Qwen3- and DeepSeek-style EAGLE-3 heads (e.g. LlamaForCausalLMEagle3)")
    hidden, layers, vocab = target.get("hidden_size"), target.get("num_hidden_layers"), target.get("vocab_size")
    if isinstance(hidden, int) and head.target_hidden_size != hidden:
        out.append(f"{at} reads hidden states of size {head.target_hidden_size} (config.json target_hidden_size, "
                   f"else hidden_size), MODEL_PATH's hidden_size is {hidden}: the head was made for another model; "
                   "use a head trained on MODEL_PATH")
    shared = [part for part in ("embed_tokens", "lm_head") if head.shapes is not None and not head.has(part)]
    if shared and isinstance(hidden, int) and head.hidden_size != hidden:
        out.append(f"{at} has no {' or '.join(shared)} of its own, so vLLM gives it MODEL_PATH's, of width {hidden}, "
                   f"but the head's hidden_size is {head.hidden_size}; use a head trained on MODEL_PATH")
    if isinstance(vocab, int):
        out += _vocab_problems(head, vocab, "lm_head" in shared, at)
    if isinstance(layers, int):
        out += _aux_problems(head, layers, hidden if isinstance(hidden, int) else head.target_hidden_size, at)
    for what, n in (("num_attention_heads", head.heads), ("intermediate_size", head.intermediate_size)):
        if n % tp:
            out.append(f"{at}: ROLLOUT_TP={tp} does not divide the head's {what}={n} (vLLM shards the head at the "
                       "target's TP); choose a ROLLOUT_TP that divides it")
    kv = head.kv_heads
    if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
        out.append(f"{at}: ROLLOUT_TP={tp} and the head's num_key_value_heads={kv}: vLLM needs one to divide the "
                   "other (it shards or replicates the KV heads); choose another ROLLOUT_TP")
    return out


def _vocab_problems(head: Head, vocab: int, shared_lm_head: bool, at: str) -> list[str]:
    out = []
    if head.vocab_size != vocab:
        out.append(f"{at}: the head's vocab_size={head.vocab_size}, MODEL_PATH's is {vocab}: vLLM scatters the "
                   "draft logits into the target's vocabulary, so the head must be made for MODEL_PATH's tokenizer")
        return out
    draft = head.draft_vocab_size
    if shared_lm_head and draft != vocab:
        out.append(f"{at} has no lm_head of its own (vLLM shares MODEL_PATH's, {vocab} tokens) but draft_vocab_size="
                   f"{draft}; give the head its lm_head or set draft_vocab_size={vocab}")
    lm = head.shape("lm_head.weight")
    if lm is not None and lm != (draft, head.hidden_size):
        out.append(f"{at}: lm_head.weight is {list(lm)}, config.json says [draft_vocab_size={draft}, hidden_size="
                   f"{head.hidden_size}]")
    if draft > vocab:
        out.append(f"{at}: draft_vocab_size={draft} exceeds MODEL_PATH's vocab_size={vocab}")
    elif draft < vocab and head.shapes is not None:
        if not head.has("d2t"):
            out.append(f"{at}: draft_vocab_size={draft} < vocab_size={vocab} but the head has no d2t map (draft id "
                       f"-> target id offsets): vLLM would read draft id i as token i; use the head's full "
                       "checkpoint, with its d2t")
        elif head.d2t is not None:
            targets = [i + d for i, d in enumerate(head.d2t)]
            if len(targets) != draft or len(set(targets)) != draft or min(targets) < 0 or max(targets) >= vocab:
                out.append(f"{at}: its d2t map does not send the {draft} draft ids to distinct tokens below "
                           f"{vocab} ({len(targets)} entries, targets {min(targets)}..{max(targets)})")
    return out


def _aux_problems(head: Head, layers: int, hidden: int, at: str) -> list[str]:
    ids = head.aux_layer_ids
    given = ids is not None
    if not given:
        ids = default_aux_layers(layers)
    where = ("config.json eagle_aux_hidden_state_layer_ids" if given else
             f"vLLM's default for a {layers}-layer model, (2, L // 2, L - 3), as the head's config names none")
    want = head.num_aux or (len(ids) if given else 3)
    fc = head.shape("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] % max(hidden, 1) == 0:
        want = fc[1] // hidden
    out = []
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i <= layers]
    if bad:
        out.append(f"{at}: aux layer ids {list(ids)} ({where}) name {bad}, outside MODEL_PATH's 0..{layers} (0: the "
                   f"embeddings, i: after layer i); the head was made for a deeper model")
    elif len(set(ids)) != want:
        fix = (f"name {want} distinct layers in the head's eagle_aux_hidden_state_layer_ids, e.g. "
               f"{list(range(layers - want, layers))}" if want <= layers else "use a head made for MODEL_PATH")
        out.append(f"{at}: the head's fc takes {want} hidden states but the aux layer ids {list(ids)} ({where}) "
                   f"give {len(set(ids))} distinct ones (vLLM collects each layer once): a shape error at the first "
                   f"draft; {fix}")
    elif list(ids) != sorted(ids):
        out.append(f"{at}: aux layer ids {list(ids)} ({where}) are not ascending: vLLM concatenates the hidden "
                   "states in layer order, so the head would read them permuted; list them in ascending order if "
                   "the head was trained in that order")
    return out


def check_draft_head(cfg: Mapping, hf: dict | None, errors: list[str], notes: list[str]) -> None:
    """The composed config's ``eagle3`` head against the model (``hf``: its text config); problems to ``errors``,
    the head's summary to ``notes``."""
    from ..rollout_spec import KEY

    spec = select(cfg, KEY)
    online = str(select(cfg, "recipe.draft_head.online", False)).lower() in ("1", "true")
    if not isinstance(spec, Mapping) or spec.get("method") != "eagle3":
        if online:
            errors.append("ROLLOUT_DRAFT_ONLINE=1 (recipe.draft_head.online) trains an EAGLE-3 head: set "
                          f"ROLLOUT_SPECULATIVE=eagle3 and {VAR}, or unset ROLLOUT_DRAFT_ONLINE")
        return
    tp = select(cfg, f"{ARR}.rollout.tensor_model_parallel_size") or 1
    draft_tp = spec.get("draft_tensor_parallel_size") or tp
    if draft_tp not in (1, tp):
        errors.append(f"speculative_config.draft_tensor_parallel_size={draft_tp}: vLLM allows 1 or ROLLOUT_TP={tp}")
        return
    if not spec.get("model"):
        errors.append(f"speculative_config.method=eagle3 without a model: export {VAR}=/path/to/head")
        return
    try:
        head = read_head(spec["model"])
    except ValueError as e:
        errors.append(str(e))
        return
    if hf is None:
        return  # the model check names MODEL_PATH's problem
    found = head_problems(head, hf, draft_tp)
    if online and (head.layers != 1 or head.arch not in ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")):
        found.append(f"ROLLOUT_DRAFT_ONLINE=1: the online trainer trains vLLM's one-layer EAGLE-3 Llama head "
                     f"(LlamaForCausalLMEagle3, recipe/drafting/eagle3_model.py); {head.path} is {head.arch} with "
                     f"{head.layers} layer(s): convert it to that format, or unset ROLLOUT_DRAFT_ONLINE")
    errors.extend(found)
    if not found:
        ids = head.aux_layer_ids or default_aux_layers(hf["num_hidden_layers"])
        notes.append(f"ROLLOUT_SPECULATIVE=eagle3: {head.arch} at {head.path}, {head.layers} layer(s), reading "
                     f"layers {list(ids)} of {hf['num_hidden_layers']}, draft vocabulary {head.draft_vocab_size} of "
                     f"{head.vocab_size}" + ("" if head.shapes is not None else " (no safetensors: tensor shapes "
                                             "not checked)"))
