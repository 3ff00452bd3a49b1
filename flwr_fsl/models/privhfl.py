"""PrivHFL's heterogeneous client models for 28x28 grayscale images, and their training loops.

In PrivHFL (Sun et al., §3.1, App. F) every client owns its own architecture and knowledge
moves only through predictions on query data, never through weights. The paper uses VGG-7,
ResNet-8 and ResNet-10 on 32x32 color images; these are the same shapes at CPU-friendly
widths for 28x28 gray images (MNIST / Fashion-MNIST), plus a small MLP:

=============  ==================================================================  ===========
name           layers (``w`` = ``width``, 3x3 convs with padding 1)                parameters
=============  ==================================================================  ===========
``vgg7``       conv w, conv w, max 2 | conv 2w, conv 2w, max 2 | conv 4w,           20,930
               conv 4w, max 2 (7 -> 3) | linear 4w*9 -> classes: 6 conv + 1 fc
``resnet8``    conv w | block(w) | block(2w, /2) | block(4w, /2) | avg 7x7 | linear  19,642
``resnet10``   conv w | block(w) | block(2w, /2) | block(4w, /2) | block(4w) | avg |  38,138
               linear: 1 + 4x2 conv + 1 fc = 10 functional layers (the paper's text)
``mlp``        flatten | linear 784 -> 128 | ReLU | linear 128 -> 64 | ReLU |          109,386
               linear 64 -> classes
=============  ==================================================================  ===========

(Parameter counts at the default ``width = 8`` and 10 classes; ``tests/models/
test_privhfl_models.py`` asserts them.)

A residual ``block(c, /s)`` is ``relu(conv3x3(relu(conv3x3_s(x))) + shortcut(x))`` where the
shortcut is the identity, or a 1x1 convolution with stride ``s`` when the shape changes.

**Initialization without batch norm.** Convolutions and linear layers start from He (Kaiming)
normal weights and zero biases, and the last convolution of every residual body starts at zero
("zero-init residual", Goyal et al. 2017; Fixup, Zhang et al. 2019), so each block starts as its
shortcut. With PyTorch's default initialization these BN-free networks did not leave chance
level on the toy task of ``tests/models/test_privhfl_models.py`` within 6 epochs; with this one
every architecture fits it.

The
paper describes ResNet-8 as "a convolutional layer, 2 residual blocks with 4 convolutional
layers, followed by a fully-connected layer" (6 functional layers, not 8); we use three
two-conv blocks so that the name counts layers the way ResNet-10's description does.

**Only layers secure inference can evaluate.** Every model is a flat :class:`torch.nn.Sequential`
of :data:`SECURE_LAYERS` — ``Linear``, ``Conv2d``, ``ReLU``, ``MaxPool2d``, ``AvgPool2d``,
``Flatten`` — and :class:`Residual` (``body(x) + shortcut(x)``, whose ``body`` and
``shortcut`` are made of the same layers or ``Identity``). There is no batch norm (nothing to
fold) and no adaptive pooling (the global average pool is an ``AvgPool2d`` with an explicit
7x7 kernel). :func:`check_secure_evaluable` walks a model and names the first module outside
that set, so the secure-inference core (:mod:`flwr_fsl.families.privhfl.protocol`) can refuse a
model up front. Linear layers (convolution, fully connected, average pooling) map to Beaver matrix
products, ``ReLU`` to DReLU, ``MaxPool2d`` to a tree of comparisons and the residual add is
local.

Inputs are ``(N, 1, 28, 28)`` float32 (:func:`as_images` reshapes ``(N, 28, 28)`` or
``(N, 784)``; the training loops take any ``(N, C, H, W)`` batch a model accepts). Training:
:func:`train_private` (SGD with momentum on the private data, the paper's local phase) and
:func:`retrain` (Adam on the query set with soft labels plus the private data, the paper's
re-training phase, App. F); :func:`predict_logits` and :func:`penultimate_features` feed query
selection (:mod:`flwr_fsl.families.privhfl.queries`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "ARCHITECTURES",
    "IMAGE_SHAPE",
    "SECURE_LAYERS",
    "Residual",
    "as_images",
    "build_model",
    "check_secure_evaluable",
    "mlp",
    "penultimate_features",
    "predict_logits",
    "resnet8",
    "resnet10",
    "retrain",
    "secure_layers",
    "train_private",
    "vgg7",
]

IMAGE_SHAPE: tuple[int, int, int] = (1, 28, 28)
"""``(channels, height, width)`` of every model's input."""

SECURE_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv2d,
    nn.ReLU,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.Flatten,
    nn.Identity,
)
"""The leaf modules secure inference evaluates (beside :class:`Residual` and ``Sequential``)."""


class Residual(nn.Module):
    """``body(x) + shortcut(x)``: a residual connection made of secure-evaluable layers.

    Parameters
    ----------
    body : nn.Sequential
        The main path.
    shortcut : nn.Module, optional
        The skip path: ``nn.Identity()`` (default) or a ``Sequential``/``Conv2d`` that maps
        the input to the body's output shape.
    """

    def __init__(self, body: nn.Sequential, shortcut: nn.Module | None = None) -> None:
        super().__init__()
        if not isinstance(body, nn.Sequential) or len(body) == 0:
            raise ConfigurationError("body must be a non-empty nn.Sequential")
        self.body = body
        self.shortcut = nn.Identity() if shortcut is None else shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``body(x) + shortcut(x)``."""
        return self.body(x) + self.shortcut(x)

    def privhfl_residual(self) -> tuple[nn.Sequential, nn.Module | None]:
        """Return ``(body, shortcut)``, ``None`` for an identity shortcut.

        The hook by which :func:`flwr_fsl.families.privhfl.inference.from_torch` recognises a
        residual block.
        """
        return self.body, None if isinstance(self.shortcut, nn.Identity) else self.shortcut


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigurationError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1)


def _block(c_in: int, c_out: int, stride: int = 1) -> list[nn.Module]:
    body = nn.Sequential(_conv(c_in, c_out, stride), nn.ReLU(), _conv(c_out, c_out))
    shortcut: nn.Module | None = None
    if stride != 1 or c_in != c_out:
        shortcut = nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride)
    return [Residual(body, shortcut), nn.ReLU()]


def vgg7(width: int = 8, num_classes: int = 10) -> nn.Sequential:
    """VGG-7-like: six 3x3 convolutions in three max-pooled stages, then one linear layer.

    Parameters
    ----------
    width : int
        Channels of the first stage (the others have ``2 * width`` and ``4 * width``), >= 1.
    num_classes : int
        Number of classes, >= 2.

    Returns
    -------
    nn.Sequential
        The model, input ``(N, 1, 28, 28)``, output ``(N, num_classes)`` logits.
    """
    w = _check_int("width", width, 1)
    _check_int("num_classes", num_classes, 2)
    layers: list[nn.Module] = []
    c_in = IMAGE_SHAPE[0]
    for c in (w, 2 * w, 4 * w):  # 28 -> 14 -> 7 -> 3
        layers += [_conv(c_in, c), nn.ReLU(), _conv(c, c), nn.ReLU(), nn.MaxPool2d(2)]
        c_in = c
    layers += [nn.Flatten(), nn.Linear(4 * w * 3 * 3, num_classes)]
    return _initialize(nn.Sequential(*layers))


def _initialize(model: nn.Sequential) -> nn.Sequential:
    """He-normal weights, zero biases, and zero for each residual body's last convolution."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, Residual) and isinstance(module.body[-1], nn.Conv2d):
            nn.init.zeros_(module.body[-1].weight)
    return model


def _resnet(width: int, num_classes: int, stages: tuple[tuple[int, int], ...]) -> nn.Sequential:
    w = _check_int("width", width, 1)
    _check_int("num_classes", num_classes, 2)
    layers: list[nn.Module] = [_conv(IMAGE_SHAPE[0], w), nn.ReLU()]
    c_in, size = w, IMAGE_SHAPE[1]
    for multiple, stride in stages:
        layers += _block(c_in, multiple * w, stride)
        c_in = multiple * w
        size = (size - 1) // stride + 1
    layers += [nn.AvgPool2d(size), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return _initialize(nn.Sequential(*layers))


def resnet8(width: int = 8, num_classes: int = 10) -> nn.Sequential:
    """ResNet-8-like: a stem convolution, three two-conv residual blocks, average pool, linear.

    Parameters
    ----------
    width : int
        Channels of the stem (blocks have ``width``, ``2 * width``, ``4 * width``), >= 1.
    num_classes : int
        Number of classes, >= 2.

    Returns
    -------
    nn.Sequential
        The model (module docstring for the layer list).
    """
    return _resnet(width, num_classes, ((1, 1), (2, 2), (4, 2)))


def resnet10(width: int = 8, num_classes: int = 10) -> nn.Sequential:
    """ResNet-10-like: a stem convolution, four two-conv residual blocks, average pool, linear.

    Parameters
    ----------
    width : int
        Channels of the stem (blocks have ``width``, ``2w``, ``4w``, ``4w``), >= 1.
    num_classes : int
        Number of classes, >= 2.

    Returns
    -------
    nn.Sequential
        The model (module docstring for the layer list).
    """
    return _resnet(width, num_classes, ((1, 1), (2, 2), (4, 2), (4, 1)))


def mlp(hidden: tuple[int, ...] = (128, 64), num_classes: int = 10) -> nn.Sequential:
    """Build a small MLP: flatten, then linear layers with ReLU between them.

    Parameters
    ----------
    hidden : tuple[int, ...]
        Hidden widths, each >= 1 (at least one).
    num_classes : int
        Number of classes, >= 2.

    Returns
    -------
    nn.Sequential
        The model.
    """
    if not hidden:
        raise ConfigurationError("hidden must name at least one layer width")
    widths = [_check_int("hidden width", h, 1) for h in hidden]
    _check_int("num_classes", num_classes, 2)
    layers: list[nn.Module] = [nn.Flatten()]
    c_in = int(np.prod(IMAGE_SHAPE))
    for h in widths:
        layers += [nn.Linear(c_in, h), nn.ReLU()]
        c_in = h
    layers.append(nn.Linear(c_in, num_classes))
    return _initialize(nn.Sequential(*layers))


ARCHITECTURES: dict[str, Callable[..., nn.Sequential]] = {
    "vgg7": vgg7,
    "resnet8": resnet8,
    "resnet10": resnet10,
    "mlp": mlp,
}
"""Name -> builder; the builders take ``num_classes`` (and ``width`` / ``hidden``)."""


def build_model(name: str, num_classes: int = 10, seed: int | None = None) -> nn.Sequential:
    """Build architecture ``name`` with its default width, seeded.

    Parameters
    ----------
    name : str
        One of :data:`ARCHITECTURES`.
    num_classes : int
        Number of classes, >= 2.
    seed : int, optional
        Seed of the initial weights (None: torch's global generator).

    Returns
    -------
    nn.Sequential
        The model.

    Raises
    ------
    ConfigurationError
        If ``name`` is unknown.
    """
    if name not in ARCHITECTURES:
        raise ConfigurationError(
            f"unknown architecture {name!r}; choose one of {sorted(ARCHITECTURES)}"
        )
    if seed is None:
        return ARCHITECTURES[name](num_classes=num_classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ARCHITECTURES[name](num_classes=num_classes)


def secure_layers(model: nn.Module) -> Iterator[nn.Module]:
    """Yield every leaf module of ``model`` in forward order (inside residual paths too)."""
    if isinstance(model, nn.Sequential):
        for child in model:
            yield from secure_layers(child)
    elif isinstance(model, Residual):
        yield from secure_layers(model.body)
        yield from secure_layers(model.shortcut)
    else:
        yield model


def check_secure_evaluable(model: nn.Module) -> None:
    """Check that ``model`` is made only of layers secure inference can evaluate.

    Parameters
    ----------
    model : nn.Module
        A ``Sequential`` of :data:`SECURE_LAYERS` and :class:`Residual` blocks.

    Raises
    ------
    ConfigurationError
        Naming the first module that is not evaluable (e.g. ``BatchNorm2d``, ``Dropout``,
        ``AdaptiveAvgPool2d``, a custom module), a pooling layer with padding, dilation or
        ``ceil_mode``, or a convolution with groups/dilation/a padding mode other than zeros.
    """
    if not isinstance(model, nn.Sequential):
        raise ConfigurationError(f"the model must be an nn.Sequential, got {type(model).__name__}")
    for layer in secure_layers(model):
        if type(layer) not in SECURE_LAYERS:
            raise ConfigurationError(f"{type(layer).__name__} cannot be evaluated securely")
        if isinstance(layer, nn.Conv2d) and (
            layer.groups != 1 or layer.dilation != (1, 1) or layer.padding_mode != "zeros"
        ):
            raise ConfigurationError(
                "only plain Conv2d (groups 1, dilation 1, zero padding) is supported"
            )
        if isinstance(layer, nn.MaxPool2d | nn.AvgPool2d):
            padding = layer.padding if isinstance(layer.padding, tuple) else (layer.padding,)
            dilation = getattr(layer, "dilation", 1)
            if any(p != 0 for p in padding) or layer.ceil_mode or dilation not in (1, (1, 1)):
                raise ConfigurationError(
                    f"{type(layer).__name__} with padding, dilation or ceil_mode is not supported"
                )


def as_images(x: NDArray[np.floating] | torch.Tensor) -> torch.Tensor:
    """Return ``x`` as a float32 image batch ``(N, C, H, W)`` (a copy if read-only).

    ``(N, C, H, W)`` is kept, ``(N, H, W)`` gets one channel, ``(N, 784)`` becomes
    ``(N, 1, 28, 28)``.

    Raises
    ------
    ConfigurationError
        For any other shape.
    """
    if isinstance(x, torch.Tensor):
        t = x.to(torch.float32)
    else:
        a = np.asarray(x, dtype=np.float32)
        t = torch.from_numpy(a if a.flags.writeable else a.copy())
    if t.ndim == 4:
        return t
    if t.ndim == 3:
        return t.unsqueeze(1)
    if t.ndim == 2 and t.shape[1] == int(np.prod(IMAGE_SHAPE)):
        return t.reshape(-1, *IMAGE_SHAPE)
    raise ConfigurationError(
        f"expected images (N, C, H, W), (N, H, W) or (N, 784), got {tuple(t.shape)}"
    )


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return the torch device of a ``device`` setting, checked before any work starts.

    ``"auto"`` is CUDA when ``torch.cuda.is_available()``, else the CPU; ``"cpu"``; ``"cuda"``
    or ``"cuda:N"`` (a GPU that must exist: never silently the CPU).

    Raises
    ------
    ConfigurationError
        If the value is not one of these, or names a GPU this machine does not have.
    """
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise ConfigurationError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigurationError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    if not torch.cuda.is_available():
        raise ConfigurationError(f"device {device!r}: CUDA is not available on this machine")
    if index and int(index) >= torch.cuda.device_count():
        raise ConfigurationError(
            f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device(name)


def _check_training(epochs: int, lr: float, batch_size: int) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigurationError(f"epochs must be an int >= 0, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not (isinstance(lr, int | float) and np.isfinite(lr) and lr > 0):
        raise ConfigurationError(f"lr must be a finite number > 0, got {lr!r}")


def _epochs(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    target: torch.Tensor,
    epochs: int,
    batch_size: int,
    seed: int,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> float:
    generator = torch.Generator().manual_seed(seed)  # the CPU draws the order on any device
    device = next(model.parameters()).device
    x, target = x.to(device), target.to(device)
    model.train()
    last = float("nan")
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator).to(device)
        total = torch.zeros((), dtype=torch.float64, device=device)  # no sync per batch
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            # Integer targets: class indices; float targets: class probabilities.
            loss = F.cross_entropy(model(x[idx]), target[idx])
            loss.backward()
            optimizer.step()
            total += loss.detach().double() * len(idx)
        if scheduler is not None:
            scheduler.step()
        last = float(total) / len(x)
    return last


def train_private(  # noqa: PLR0913
    model: nn.Module,
    x: NDArray[np.floating],
    y: NDArray[np.integer],
    epochs: int = 10,
    lr: float = 0.02,
    batch_size: int = 32,
    seed: int = 0,
    momentum: float = 0.9,
    optimizer: str = "sgd",
    device: str | torch.device = "auto",
) -> float:
    """Train ``model`` in place on a client's private data (PrivHFL's local phase).

    Cross-entropy with SGD and momentum, as the paper's local training (App. F, Table 7), or
    with Adam (``optimizer="adam"``, ``momentum`` unused): without batch norm the residual
    networks here train much faster with Adam (on 500 Fashion-MNIST images, 15 epochs:
    ResNet-10 0.45 train loss / 71% test with Adam at 3e-3 against 0.90 / 59% after 20 epochs
    of SGD at 0.02 — measured with the loops of this module, one run each).

    Parameters
    ----------
    model : nn.Module
        The client's model.
    x, y : NDArray
        Images (anything :func:`as_images` reads) and int labels, same length, non-empty.
    epochs : int
        Passes over the data (0: no training).
    lr, batch_size, momentum : float, int, float
        Settings (``lr > 0``, ``batch_size >= 1``, ``0 <= momentum < 1``).
    seed : int
        Seed of the shuffling.
    optimizer : str
        ``"sgd"`` or ``"adam"``.
    device : str or torch.device
        Where to train (:func:`resolve_device`: ``"auto"`` is CUDA when available); the
        model is moved back to the device it came from afterwards.

    Returns
    -------
    float
        Mean loss over the last epoch (NaN with ``epochs = 0``).

    Raises
    ------
    ConfigurationError
        If an argument is out of range or ``x``/``y`` do not match.
    """
    _check_training(epochs, lr, batch_size)
    if not 0.0 <= momentum < 1.0:
        raise ConfigurationError(f"momentum must be in [0, 1), got {momentum!r}")
    if optimizer not in ("sgd", "adam"):
        raise ConfigurationError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    xt = as_images(x)
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long)
    if len(xt) != len(yt) or len(xt) == 0:
        raise ConfigurationError(
            f"x and y must be non-empty and of one length: {len(xt)}, {len(yt)}"
        )
    dev = resolve_device(device)
    home = _device_of(model)
    model.to(dev)
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    try:
        return _epochs(model, opt, xt, yt, epochs, batch_size, seed)
    finally:
        model.to(home)


def _device_of(model: nn.Module) -> torch.device:
    return (
        next(model.parameters()).device
        if any(True for _ in model.parameters())
        else (torch.device("cpu"))
    )


def retrain(  # noqa: PLR0913
    model: nn.Module,
    x_private: NDArray[np.floating],
    y_private: NDArray[np.integer],
    x_query: NDArray[np.floating] | None,
    soft_labels: NDArray[np.floating] | None,
    epochs: int = 5,
    lr: float = 2e-3,
    batch_size: int = 64,
    seed: int = 0,
    device: str | torch.device = "auto",
) -> float:
    """Re-train ``model`` in place on (query, soft label) pairs plus the private data.

    The paper's re-training phase (App. F): Adam at ``lr``, decayed by 10x halfway through
    (their 50 epochs decay at 25), on the union of the query set — targets are the soft labels,
    i.e. class probabilities — and the private data (one-hot targets), shuffled together.

    Parameters
    ----------
    model : nn.Module
        The client's model.
    x_private, y_private : NDArray
        The private images and int labels.
    x_query, soft_labels : NDArray or None
        The query images and a probability vector per query (rows sum to 1), or both None
        to re-train on the private data alone (the equal-effort local baseline).
    epochs, lr, batch_size, seed : int, float, int, int
        Adam settings and the shuffling seed.
    device : str or torch.device
        Where to train (:func:`resolve_device`); the model returns to its device afterwards.

    Returns
    -------
    float
        Mean loss over the last epoch (NaN with ``epochs = 0``).

    Raises
    ------
    ConfigurationError
        If shapes disagree, ``soft_labels`` are not probability vectors over the model's
        classes, or an argument is out of range.
    """
    _check_training(epochs, lr, batch_size)
    dev = resolve_device(device)
    xp = as_images(x_private)
    yp = torch.as_tensor(np.asarray(y_private), dtype=torch.long)
    if len(xp) != len(yp) or len(xp) == 0:
        raise ConfigurationError("x_private and y_private must be non-empty and of one length")
    if (x_query is None) != (soft_labels is None):
        raise ConfigurationError("give both x_query and soft_labels, or neither")
    home = _device_of(model)
    with torch.no_grad():
        num_classes = int(model.eval()(xp[:1].to(home)).shape[1])
    if int(yp.min()) < 0 or int(yp.max()) >= num_classes:
        raise ConfigurationError(f"y_private must hold labels in [0, {num_classes})")
    targets = F.one_hot(yp, num_classes).to(torch.float32)
    x_all = xp
    if x_query is not None and soft_labels is not None:
        xq = as_images(x_query)
        soft = torch.as_tensor(np.asarray(soft_labels, dtype=np.float32))
        if soft.shape != (len(xq), num_classes):
            raise ConfigurationError(f"soft_labels must have shape {(len(xq), num_classes)}")
        if not bool(torch.isfinite(soft).all()) or bool((soft < 0).any()):
            raise ConfigurationError("soft_labels must be finite and non-negative")
        if not torch.allclose(soft.sum(1), torch.ones(len(soft)), atol=1e-4):
            raise ConfigurationError("each row of soft_labels must sum to 1")
        x_all = torch.cat([xp, xq])
        targets = torch.cat([targets, soft])
    model.to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, epochs // 2), gamma=0.1)
    try:
        return _epochs(model, optimizer, x_all, targets, epochs, batch_size, seed, scheduler)
    finally:
        model.to(home)


@torch.no_grad()
def predict_logits(
    model: nn.Module, x: NDArray[np.floating], batch_size: int = 512
) -> NDArray[np.float32]:
    """Return ``model``'s logits on ``x`` as float32 ``(N, classes)`` (evaluation mode).

    Runs where the model is (its parameters' device).
    """
    _check_training(1, 1.0, batch_size)
    model.eval()
    dev = _device_of(model)
    xt = as_images(x)
    parts = [model(xt[s : s + batch_size].to(dev)) for s in range(0, len(xt), batch_size)]
    if not parts:
        return np.zeros((0, 0), dtype=np.float32)
    return torch.cat(parts).cpu().numpy().astype(np.float32)


@torch.no_grad()
def penultimate_features(
    model: nn.Sequential, x: NDArray[np.floating], batch_size: int = 512
) -> NDArray[np.float32]:
    """Return the input of the final linear layer on ``x`` (k-center's embedding space).

    Raises
    ------
    ConfigurationError
        If ``model`` is not a ``Sequential`` ending in ``nn.Linear``.
    """
    if not isinstance(model, nn.Sequential) or not isinstance(model[-1], nn.Linear):
        raise ConfigurationError("penultimate_features needs an nn.Sequential ending in nn.Linear")
    _check_training(1, 1.0, batch_size)
    model.eval()
    trunk = model[:-1]
    xt = as_images(x)
    parts = [torch.flatten(trunk(xt[s : s + batch_size]), 1) for s in range(0, len(xt), batch_size)]
    if not parts:
        return np.zeros((0, model[-1].in_features), dtype=np.float32)
    return torch.cat(parts).numpy().astype(np.float32)
