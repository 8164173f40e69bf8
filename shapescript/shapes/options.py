"""Typed records of what the checker found about a call or an expression beyond its type, for the
stages after it: a call's options (`CallOptions`, what an op's typing rule found and its lowering
reads) and how to lower an expression (`Recipe`: a dim read as a number, a broadcast operand's
placing, `@` as a tensordot). Both are frozen: a stage that changes one (the batch split tells
dropout where the batch axis lies) makes a new one with `dataclasses.replace`."""

from __future__ import annotations

from dataclasses import dataclass

# A dim's size as a function reads it at run time: a number, or (parameter, axis) for a generic dim
# read off a parameter's shape (axis "size": a dataset's length). None where a declared dim still
# waits for its value (given when loading: the build refuses to go on without it).
ParamSize = tuple[str, int | str]
SizeSource = int | ParamSize
# Where a broadcast operand's axes go among the result's: ":" keeps an axis, None inserts one.
Placing = tuple[str | None, ...]
# A pattern's split of each operand axis into its atoms' sizes (None: the axis stays one atom); a
# size is a number, -1 (inferred) or ("axis", k), the size of the operand's whole axis k.
PatternSplit = tuple[tuple[int | tuple[str, int], ...] | None, ...]


@dataclass(frozen=True)
class CallOptions:
    """What a call of an op of the table carries besides its arguments, for its lowering: each
    family of ops has a kind of its own below, with only the fields its ops read (an op's entry in
    the table names its kind, so mypy checks that its rule gives what its lowering reads); an op
    that reads nothing takes this empty one."""


@dataclass(frozen=True)
class AxisOptions(CallOptions):
    """Reductions, operations along one axis, cross_entropy, gather, batch_norm."""
    axis: int | None = None  # the axis it works along (`over=`); None: over everything
    rank: int | None = None  # the operand's rank (a reduction over everything, cross_entropy's logits)
    mask_index: Placing | None = None  # a mask's placing index (None: no mask; (): torch places it)


@dataclass(frozen=True)
class NormOptions(AxisOptions):
    """norm: of a tensor along an axis (None: all of it), or of a model's gradients."""
    grads: bool = False


@dataclass(frozen=True)
class NormalizeOptions(AxisOptions):
    """layer_norm, rms_norm, group_norm (ops/norms.py): the axis normalized (`axis`; group_norm's
    channels), the affine params given ("weight", "bias": printed after x, in that order), whether
    `eps=` is given (printed last), and group_norm's groups."""
    affine: tuple[str, ...] = ()
    eps: bool = False
    groups: int = 1


@dataclass(frozen=True)
class TopKOptions(AxisOptions):
    k: int = 1
    label: str | None = None  # its axis without a size, by name


@dataclass(frozen=True)
class WindowOptions(CallOptions):
    """Convolutions and pooling: how many trailing axes they slide over, and torch's settings."""
    spatial: int = 2
    kernel: tuple[int, ...] = ()  # pooling's window (a convolution's is its weight's shape)
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    output_padding: int = 0  # conv_transpose2d's: added to one side of each output axis


@dataclass(frozen=True)
class LossOptions(AxisOptions):
    """The losses that compare a value with a target, and cosine_similarity: the keyword numbers
    given (torch's names, printed after the two tensors in the arguments' order, as `beta=`), and
    where the batch axis lies when the split puts it on the axis a call sums over (`axis`)."""
    keywords: tuple[str, ...] = ()
    batch_axis: int | None = None


@dataclass(frozen=True)
class MaskOptions(CallOptions):
    """masked_fill's mask, where's condition: its placing index (None: no mask; (): torch places it)."""
    mask_index: Placing | None = None


@dataclass(frozen=True)
class ClampOptions(CallOptions):
    bounds: tuple[str, ...]  # which bounds are given ("min", "max"), in its arguments' order


@dataclass(frozen=True)
class CastOptions(CallOptions):
    """to: the dtype converted to, and whether the value is a plain number, made a [] tensor."""
    dtype: str
    number: bool = False


@dataclass(frozen=True)
class OneHotOptions(CallOptions):
    classes: int
    dtype: str = "f32"  # the program's precision


@dataclass(frozen=True)
class LabelOptions(CallOptions):
    """valid: the padded dim's name in the lengths."""
    label: str


@dataclass(frozen=True)
class DropoutOptions(CallOptions):
    batch_axis: int | None = None  # its operand's axis split across the devices (None: none)


@dataclass(frozen=True)
class DrawOptions(DropoutOptions, AxisOptions):
    """The random draws (random_normal, ..., categorical): where the result's batch axis lies (the
    draw is for the whole batch, each device keeping its part), categorical's axis (`axis`), and the
    keyword numbers given, in their arguments' order after the tensor and the mode."""
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True)
class SizesOptions(CallOptions):
    """causal and positions: the sizes of the dims they are given, as the function reads them."""
    sizes: tuple[SizeSource | None, ...] = ()


@dataclass(frozen=True)
class FirstOptions(SizesOptions, AxisOptions):
    """first: its count's size (`sizes`), its axis, and the count and axis as the .ss shows them."""
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LogsOptions(CallOptions):
    names: tuple[str, ...]  # its values' names


@dataclass(frozen=True)
class BatchesOptions(CallOptions):
    """The controller's batches: the data type's name (the lowering hands the run time its spec), and
    a batch size written as a number (the DeviceTable shows it)."""
    data: str
    batch_size: int | None = None


@dataclass(frozen=True)
class PatternOptions(CallOptions):
    """rearrange, reduce, repeat (ops/patterns.py): the recipe's parts, as the run time's pattern
    functions take them."""
    split: PatternSplit | None = None
    perm: tuple[int, ...] | None = None  # the atoms' order (None: as they are)
    merge: tuple[int, ...] | None = None  # how many atoms each result axis merges (None: one each)
    drop: tuple[int, ...] = ()  # rearrange: the literal 1s squeezed away
    view: tuple[int | None, ...] = ()  # repeat: None for an atom of the operand, 1 for a new axis
    new_sizes: tuple[int | None, ...] = ()  # repeat: each new axis's size (None: an operand's)
    dims: tuple[int, ...] = ()  # reduce: the atoms reduced
    op: str | None = None  # reduce: the reduction (sum, mean, max, min, prod)


@dataclass(frozen=True)
class EinsumOptions(CallOptions):
    spec: str  # as torch takes it


NO_OPTIONS = CallOptions()


@dataclass(frozen=True)
class Recipe:
    """How to lower an expression, found while checking it (Checked.recipes, by node; read by
    check/elaborate.py)."""

    dim: bool = False  # a dim used as a number (`n`, `D`), whose size `size` says how to read
    size: SizeSource | None = None
    left: Placing | None = None  # where a broadcast left operand's axes go among the result's
    right: Placing | None = None  # the same for the right operand
    tensordot: bool = False  # `@` of a right operand of rank > 2


NO_RECIPE = Recipe()
