"""The registry of error codes: each with a title, an explanation, a program that triggers it and
the way out. `shapescript explain CODE` prints an entry; docs/errors.md is generated from here
(`python -m shapescript.codes > docs/errors.md`), and the tests compile every example and check
that it fails with exactly its code.

Codes are E (an error) or W (a warning: the program still compiles), then two digits of chapter
and two of entry: 01 syntax, 02 names, 03 shapes and dtypes,
04 values, 05 `mut`, 06 training, 07 Python refused, 18 several devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from .devices import MAX_CUDA_INDEX, MAX_DEVICES
from .errors import Severity
from .names import DATA_RESERVED, MODEL_RESERVED, reserved_text
from .optimizers import kinds_text


@dataclass(frozen=True)
class Code:
    code: str
    title: str
    explanation: str
    example: str
    fix: str
    severity: Severity = Severity.ERROR  # a warning's code starts with W, an error's with E


CHAPTERS = {"01": "Syntax", "02": "Names", "03": "Shapes and dtypes", "04": "Values",
            "05": "Changing values: `mut`", "06": "Training", "07": "Python refused", "18": "Several devices"}

_ENTRIES = [
    Code("E0101", "Unexpected character",
         "The lexer met a character that is no part of the language, such as `$` or `;`, or a "
         "letter glued to a number. A program is UTF-8 text: a file with bytes that aren't UTF-8, "
         "or with a NUL byte, as a binary file has, is refused with the byte and its place (a "
         "byte-order mark at the start is skipped, as Python skips it).",
         "fn f(x: [n]) -> [n] = x $ 2\n",
         "Remove the character. Comments start with `#`."),
    Code("E0102", "Bad indentation",
         "Blocks are marked by indentation with spaces. A line indented less than its block but "
         "more than the enclosing one belongs to no block; a tab in indentation is refused.",
         "fn f(x: [n]) -> [n]:\n        y = x * 2\n    return y\n",
         "Indent every line of a block by the same number of spaces."),
    Code("E0103", "Unterminated string",
         "A string starts with `\"` and must end with `\"` on the same line.",
         "python fn load() -> int = \"mod.load\n",
         "Close the string on the line it starts."),
    Code("E0104", "Unbalanced bracket",
         "Every `(` and `[` needs its own closing bracket, in order.",
         "fn f(x: [n) -> [n] = x\n",
         "Close each bracket with the matching one."),
    Code("E0105", "Syntax error",
         "The parser expected something else at this point: the message says what it expected "
         "and what it found.",
         "fn f(x [n]) -> [n] = x\n",
         "Write the construct as the language guide shows it."),
    Code("W0106", "A character that changes the direction of text",
         "A comment or a string holds one of Unicode's bidirectional controls (U+202A to U+202E, "
         "U+2066 to U+2069). An editor, a terminal or a code review then shows the text around it "
         "in another order than the compiler reads it, so that a line can look like a comment and "
         "be code, or the reverse (the \"Trojan Source\" attack). This is a warning: the program "
         "still compiles and runs. Anywhere else in a program such a character is E0101. Diagnostics "
         "show it, as every control character of a source line or a name, as an escape (`\\u202e`).",
         "fn f(x: [n]) -> [n] = x  # \u202eevil\u202c\n",
         "Remove the character, unless the text is meant to read right to left.",
         Severity.WARNING),
    Code("E0201", "Unknown name",
         "A name, a function or a dim that the program doesn't define. Generic dims are written "
         "in lower case and need no declaration; a capitalized dim must be declared with `dim`.",
         "fn f(x: [n]) -> [n] = x * scale\n",
         "Define the name, or fix its spelling: the help line suggests a near name, dim, field or "
         "function, by spelling or by case (`Hiden` for `Hidden`, `k` for `K`)."),
    Code("E0202", "Defined twice",
         "Two items, fields, members or parameters share a name, or an item takes the name of a "
         "built-in function.",
         "dim D = 4\ndim D = 8\n",
         "Rename one of them."),
    Code("E0203", "Unknown field",
         "A batch has the fields of its data type, and a model its params, buffers and "
         "sub-models; nothing else can be read with `.`.",
         "data Ex:\n    x: [4]\n\nfn f(batch: [b] Ex) -> [b 4] = batch.y\n",
         "Use one of the fields the type declares."),
    Code("E0204", "Unknown type",
         "A type name that is neither a dtype (f16, bf16, f32, f64, i32, i64, bool), a data type, "
         f"a model, nor one of Dataset[T], {kinds_text()}, Grad[M], Index[C], Sink, int, "
         "float, bool, str. Also a generic model used without its dims or with the wrong number of "
         "them (`model Linear[I O]:` is used as `Linear[D C]`), dims given to a model of fixed "
         "sizes, and a `precision` line that doesn't name a float dtype.",
         "fn f(x: [n] f33) -> [n] f33 = x\n",
         "Fix the spelling, or declare the type; give a generic model as many dims as it declares."),
    Code("E0205", "Not a function",
         "Only functions can be called, by their name; a param's initializer must be one of "
         "normal, uniform, zeros and ones.",
         "model M:\n    param w: [4] = gaussian(std=0.1)\n",
         "Call a function that exists; initialize params with normal(mean=, std=), "
         "uniform(low=, high=), zeros() or ones()."),
    Code("E0206", "Wrong arguments",
         "A call gives too many or too few arguments, a keyword the function doesn't have, or "
         "the same argument twice.",
         "fn double(x: [n]) -> [n] = x * 2\n\nfn f(x: [n]) -> [n] = double(x, x)\n",
         "Pass exactly the parameters the function declares."),
    Code("E0207", "Reserved name",
         "From Python, a model's members and a batch's fields are attributes, beside a few the "
         "model or batch has itself, on one device as on several; a member or field can't take one "
         f"of their names. Reserved for a member: {reserved_text(MODEL_RESERVED)}; for a field: "
         f"{reserved_text(DATA_RESERVED)}.",
         "model M:\n    param state_dict: [4] = zeros()\n",
         "Rename the member or field."),
    Code("E0208", "A mixed precision that isn't narrower",
         "`precision mixed bf16` (or `f16`) keeps the params, the optimizer's state and every type "
         "written without a dtype in f32, and computes in the narrower float where torch.autocast does. "
         "f32 and f64 aren't narrower than what is kept.",
         "precision mixed f64\n\nfn f(x: [n]) -> [n] = x\n",
         "Write `precision mixed bf16` (f32's range), or `precision mixed f16` (its loss scaled), or "
         "`precision f64` for f64 throughout."),
    Code("E0301", "Shapes don't match",
         "Two shapes that must be equal differ. Dims match by name, never by size: with `dim D = 4` "
         "and `dim E = 4`, `[D]` and `[E]` are different shapes. In an elementwise operation the "
         "smaller operand's dims must all appear, in order, in the larger one's.",
         "dim D = 4\ndim E = 4\n\nfn f(x: [n D], y: [n E]) -> [n D] = x + y\n",
         "Make the dims the same, or rearrange one side first."),
    Code("E0302", "Wrong number of axes",
         "An argument has a different number of axes from the parameter it is passed to.",
         "dim D = 4\n\nfn norm2(x: [n D]) -> [n] = sum(x * x, over=D)\n\nfn f(x: [D]) -> [D] = norm2(x)\n",
         "Pass a value with the declared axes, or declare the parameter as the values it takes."),
    Code("E0303", "No such axis",
         "`over=` names the dim of the axis an operation works along; the operand must have "
         "exactly one axis of that dim.",
         "dim D = 4\ndim C = 3\n\nfn f(x: [n D]) -> [n] = sum(x, over=C)\n",
         "Name one of the operand's axes."),
    Code("E0304", "Matrix product of mismatched axes",
         "`@` contracts the last axis of its left operand with the first axis of its right one, "
         "so the two must be the same dim.",
         "dim D = 4\ndim H = 8\n\nfn f(x: [n D], w: [H D]) -> [n D] = x @ w\n",
         "Transpose the weight in its declaration (`[D H]`), or rearrange an operand."),
    Code("E0305", "Wrong result",
         "What a function returns differs from its declared result type, or a function that "
         "declares a result has no `return`.",
         "dim D = 4\n\nfn f(x: [n D]) -> [n] = x * 2\n",
         "Return a value of the declared type, or change the declaration."),
    Code("E0306", "A generic dim bound twice",
         "Within one call, every use of a generic dim such as `n` is one size. The first argument "
         "that has it binds it; a later argument with a different dim there is an error.",
         "dim D = 4\ndim E = 4\n\nfn add(x: [n], y: [n]) -> [n] = x + y\n\n"
         "fn f(a: [D], b: [E]) -> [D] = add(a, b)\n",
         "Pass arguments whose dims agree, or give the function two generic dims."),
    Code("E0307", "A pattern that doesn't fit",
         "A pattern's left side names each axis of its operand, in order; a group `(a b)` splits one "
         "axis into parts whose sizes multiply to the axis's size, with at most one part left to be "
         "inferred. Every name on the right must come from the left (or, for `repeat`, be given a "
         "size), and `rearrange` keeps every name.",
         "fn f(x: [b d]) -> [d] = rearrange(x, b d -> d)\n",
         "Reduce away the axes you drop (`reduce(x, b d -> d, sum)`), and give the sizes a group "
         "needs as keywords (`h=4`)."),
    Code("E0308", "Wrong dtype",
         "The operands of an operation, or an argument and its parameter, have different dtypes; "
         "or an operation is given a dtype it doesn't work on, such as `@` of integers or a "
         "trained param that isn't a float.",
         "fn f(x: [n] f32, y: [n] f64) -> [n] f32 = x + y\n",
         "Use values of the same dtype: convert one with `to`, as `to(y, f32)`; for the share of "
         "true values in a bool tensor, `mean(to(hit, f32))`."),
    Code("E0309", "Index out of its bound",
         "A value typed `Index[C]` is known to lie in 0..C; an integer tensor without that type, "
         "or with another bound, can't stand where `Index[C]` is expected.",
         "dim C = 10\ndim K = 5\n\nfn f(logits: [b C], y: [b] Index[K]) -> [] = "
         "cross_entropy(logits, y, over=C)\n",
         "Declare the labels with the bound the operation needs."),
    Code("E0310", "Not a size",
         "Sizes are positive whole numbers: a dim's value, a literal axis, a batch's size.",
         "dim D = 0\n",
         "Give a positive size."),
    Code("E0311", "A result dim no parameter gives",
         "Each generic dim of a function's result must appear in a parameter, so that each call "
         "knows its size.",
         "fn f(x: [n]) -> [m] = x\n",
         "Use a dim of a parameter, or declare the dim with `dim`."),
    Code("E0312", "A param without a fixed shape",
         "Params and buffers are made when the model is initialized, so every dim of their "
         "shapes must be declared with a size.",
         "model M:\n    param w: [n 4] = zeros()\n",
         "Declare the dim: `dim N = ...`."),
    Code("E0313", "A dim without a size",
         "A dim may be declared without a size (`dim V`) when the size comes at load time, as a "
         "vocabulary's; the program can be checked without it, but not built or run. (Raised when "
         "building or loading.)",
         "dim V\n\nfn f(x: [n V]) -> [n] = sum(x, over=V)\n",
         "Give the size when loading, `ss.load(path, dims={\"V\": 65})`, or on the command line, "
         "`--dim V=65`."),
    Code("E0314", "A dim defined from itself",
         "A dim may be defined from other dims (`dim D = H * Dh`), in any order, but not from "
         "itself, directly or through others: its size would never be known. The error points at "
         "the first-declared dim of the cycle and lists the cycle.",
         "dim A = 2 * B\ndim B = A + 1\n",
         "Give one dim of the cycle a size of its own, as `dim B = 64`."),
    Code("E0315", "A window that doesn't fit",
         "A convolution or a pooling slides a window along each spatial axis; its output has "
         "floor((n + 2·padding − dilation·(k − 1) − 1) / stride) + 1 positions, as torch computes "
         "them. Where the sizes are known and that is below 1 the window doesn't fit anywhere, and "
         "torch would raise; pooling may also pad at most half its window on each side.",
         "dim C = 3\n\nfn f(x: [b C 4 4], w: [8 C 5 5]) -> [b 8 1 1] = conv2d(x, w)\n",
         "Pad the input (`padding=2`), take a smaller window, or a larger input."),
    Code("E0401", "Wrong kind of value",
         "A value of one kind (a model, a dataset, a number, a batch) is used where another kind "
         "is expected.",
         "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\nfn f(m: M) -> [D] = m * 2\n",
         "Pass a value of the kind the operation takes, as its message says."),
    Code("E0402", "A model that contains itself",
         "A model's sub-models can't include the model itself, directly or through others: "
         "it would never end. A generic model can't contain a use of itself, at any dims.",
         "model A:\n    b: B\n\nmodel B:\n    a: A\n",
         "Break the cycle."),
    Code("E0403", "A loop over something else than batches, a stack or a range",
         "A `for` loop goes over a dataset's batches (`for batch in data |> batches(64):`), the "
         "models of a stack (`for block in m.blocks:`) or a range of whole numbers (`for k in "
         "range(4):`, `range(1, M)`).",
         "dim D = 4\n\nfn f(x: [n D]):\n    for row in x:\n        print(row)\n",
         "Loop over `batches(n)` of a dataset or a `range`; work on whole tensors otherwise."),
    Code("E0404", "Indexing with [...]",
         "Tensors are not indexed with `[...]`: positions are not part of the types.",
         "fn f(x: [n]) -> [] = x[0]\n",
         "Use `take(x, i, over=D)` or `window(x, start, size, over=D)`, a reduction, gather, or a "
         "pattern such as rearrange."),
    Code("E0405", "A function that calls itself",
         "A function can't call itself, directly or through other functions: its types and the "
         "DeviceTable's counts are worked out once for each function, which a recursion of any "
         "depth would defeat. The error points at the call that closes the cycle.",
         "fn halve(x: [n]) -> [n] = shrink(x * 0.5)\n\nfn shrink(x: [n]) -> [n] = halve(x)\n",
         "Repeat a step with a loop: `for k in range(n):`, over a stack of models (`for block in "
         "m.blocks:`) or over a dataset's batches."),
    Code("E0406", "A loop that changes a variable's type",
         "A variable from before a loop that the loop assigns must keep its type: the loop's body "
         "is checked once, with the types from before the loop, and every pass must agree with "
         "them. A running total started as a number becomes a tensor on the first pass. A value "
         "that grows by the same whole size along an axis on each pass (a token appended) is "
         "allowed: in the body its size is a dim of its own (`n+i`), and after a loop of a known "
         "count it is the size before plus the growth times the count (`[b (n + New)]`). A value "
         "that grows by different sizes, or shrinks, is refused.",
         "data Ex:\n    x: [4]\n\nfn total(data: Dataset[Ex]) -> []:\n    s = 0.0\n"
         "    for batch in data |> batches(8):\n        s = s + sum(batch.x)\n    return s\n",
         "Start the variable with the type the loop gives it, as `s = to(0.0, f32)`, or give the "
         "loop's result a name of its own."),
    Code("E0407", "An initializer argument that isn't a constant",
         "An initializer's arguments are worked out once, when the program is built: numbers and "
         "declared dims, with `+ - * / **`, `sqrt`, `exp` and `log` (`normal(std=0.02 / sqrt(2 * L))`). "
         "A param, a generic dim, a name the program doesn't declare, or an expression with no "
         "value (a division by zero, `log(0)`) is refused.",
         "dim D = 4\n\nmodel M:\n    param w: [D] = normal(std=1.0 / n)\n",
         "Use numbers and declared dims: `normal(std=1.0 / D)`."),
    Code("E0408", "Arithmetic a gradient doesn't have",
         "A `Grad[M]` holds a value for each trained param of M. Gradients of the same model add "
         "and subtract (`g1 + g2`, the gradient of the two losses' sum), and a gradient scales by a "
         "number or a float `[]` (`g / 4`, `g * s`), as accumulating over micro-batches needs. "
         "Gradients of different models, a product of two gradients, or a gradient with a tensor "
         "of any other shape have no meaning and are refused.",
         "dim D = 4\n\nmodel A:\n    param w: [D] = zeros()\n\nmodel B:\n    param w: [D] = zeros()\n\n"
         "fn l(m: A) -> [] = sum(m.w * m.w, over=D)\n\nfn k(m: B) -> [] = sum(m.w, over=D)\n\n"
         "fn both(a: A, b: B) -> Grad[A]:\n    la, ga = value_and_grad(l, a)\n"
         "    lb, gb = value_and_grad(k, b)\n    return ga + gb\n",
         "Add gradients of one model, each taken with `value_and_grad` of that model; scale with a number."),
    Code("E0409", "A condition that isn't one bool",
         "`if` takes one bool: a plain one (`k > 0`, a `bool` argument) or a `[] bool` tensor, "
         "which every device holds whole, so every device takes the same branch. A tensor with "
         "axes holds a bool per value, and a number is no condition.",
         "dim D = 4\n\nfn clip(x: [b D]) -> [b D]:\n    if x > 1.0:\n        return x * 0.5\n    return x\n",
         "Choose value by value with `where(x > 1.0, a, b)`, or reduce to one value first "
         "(`max(x, over=D)` along each axis)."),
    Code("E0410", "Branches that leave a variable with different types",
         "After an `if`, a variable both branches assign has the type both give it; a name only "
         "one branch assigns can't be used after the `if`.",
         "dim D = 4\n\nfn f(x: [b D], flag: bool) -> [b D]:\n    y = x\n    if flag:\n        y = sum(x, over=D)\n"
         "    return y\n",
         "Give both branches' values one type, or a name of their own."),
    Code("E0501", "Changing what isn't `mut`",
         "A function may change only the parameters it declares `mut`; passing anything else to "
         "a `mut` parameter is an error.",
         "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\n"
         "fn loss(m: M, x: [b D]) -> [] = mean(x @ m.w)\n\n"
         "fn step(m: M, mut opt: Sgd[M], x: [b D]) -> []:\n"
         "    l, g = value_and_grad(loss, m, x)\n    update(mut m, mut opt, g)\n    return l\n",
         "Declare the parameter `mut` in the function that changes it."),
    Code("E0502", "A change the call doesn't show",
         "When a function changes an argument, the call says so with `mut`, so a reader sees "
         "every change at the call site.",
         "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\n"
         "fn loss(m: M, x: [b D]) -> [] = mean(x @ m.w)\n\n"
         "fn step(mut m: M, mut opt: Sgd[M], x: [b D]) -> []:\n"
         "    l, g = value_and_grad(loss, m, x)\n    update(m, mut opt, g)\n    return l\n",
         "Write `mut` before the argument."),
    Code("E0503", "`mut` on an argument that isn't changed",
         "`mut` at a call marks an argument the function changes; on any other it would mislead. "
         "(If the function does change it but forgot `mut` in its own parameters, only that is "
         "reported, as E0501.)",
         "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\n"
         "fn loss(m: M, x: [b D]) -> [] = mean(x @ m.w)\n\n"
         "fn f(mut m: M, x: [b D]) -> [] = loss(mut m, x)\n",
         "Remove `mut`."),
    Code("E0601", "value_and_grad of something it can't differentiate",
         "`value_and_grad(f, m, ...)` calls `f(m, ...)` and differentiates it with respect to the "
         "model `m`: `f` must be a function, take the model first, and return a float scalar `[]`.",
         "dim D = 4\n\nmodel M:\n    param w: [D] = zeros()\n\n"
         "fn scores(m: M, x: [b D]) -> [b] = x @ m.w\n\n"
         "fn f(m: M, x: [b D]) -> []:\n    v, g = value_and_grad(scores, m, x)\n    return mean(v)\n",
         "Reduce the function's result to a scalar, as `mean(...)`."),
    Code("E0701", "Python code in a program loaded with Python refused",
         "A `python fn` or an `extern fn` names a Python function, which the program imports and calls "
         "when it runs: any function, with the rights of the process that runs it. A program loaded "
         "with Python refused (`ss.load(..., python=False)`, `shapescript run --no-python`) may name "
         "none, but for the functions of ShapeScript's own standard library, `shapescript.std` "
         "(`layer_norm`, `rms_norm`). Nothing is imported to find this out.",
         "dim D = 4\n\npython fn add_noise(x: [n D], scale: float) -> [n D] = \"my_module.add_noise\"\n",
         "Write the function in ShapeScript, or name one of `shapescript.std`'s. If you trust the module "
         "the program names, load it with Python allowed: `ss.load(path)`, `shapescript run` without "
         "`--no-python`."),
    Code("E1801", "An operation across the batch axis with no lowering for several devices",
         "On several devices each one holds a part of the batch, so an operation that works across "
         "the batch axis needs every device's part. Sums, means, cross_entropy, batch_norm, and "
         "`@`, matmul, einsum and reduce with sum that contract the batch axis combine the parts "
         "with an all-reduce; any other reduction over the batch axis, an operation along it (such "
         "as softmax, sort, topk or `layer_norm(x, over=b)`, or an extern fn given it as an "
         "`Axis[...]` argument), indexing or slicing it (`take`, `window`, `first`, `put`, `cat` or "
         "`pad` with `over=b`), causal with it, and positions, first or window counting the batch's "
         "size have no such lowering yet.",
         "devices cuda[0 1 2]\n\ndim D = 4\n\ndata Ex:\n    x: [D]\n\n"
         "fn largest(batch: [b] Ex) -> [D]:\n    return max(batch.x, over=b)\n",
         "Compute it per example, or with an operation that has a lowering, or declare one device."),
    Code("E1802", "A batch axis that can't stay split",
         "A value with the batch axis is split along it, each device holding some of the examples, "
         "so the batch axis must stay an axis of its own, with a generic size that each device's part "
         "gives. Five cases are errors: grouping it with another axis, as `(b d)` (or `b*D` as a "
         "call binds a dim); a value with the batch axis twice; a batch of a fixed size, as "
         "`[64] Ex`; the batch's size used as a number (on each device it would be that device's "
         "part's size); and a value with the batch axis passed to a parameter without a shape. The "
         "last can't arise in ShapeScript: every parameter that takes a tensor declares its shape, "
         "and a tensor given to one that takes an `int` or a `float` is E0401 first.",
         "devices cuda[0 1]\n\ndim D = 4\n\ndata Ex:\n    x: [D]\n\n"
         "fn flat(batch: [b] Ex) -> [b*D]:\n    return rearrange(batch.x, b d -> (b d))\n",
         "Keep the batch axis apart, as in `b (h w)` rather than `(b h) w`, and use `mean` rather "
         "than a sum divided by the batch's size."),
    Code("E1803", "Device work in a function that runs in the controller",
         "With several devices, a function that loops over a dataset, prints, saves or loads a "
         "checkpoint, writes to a sink, calls Python, or takes a dataset or a sink runs in the "
         "controller, as does any function that calls one. `value_and_grad`, `update` and changing "
         "a model's field are device work, as are adding or scaling gradients and reading a "
         "gradient's field: they run on the workers, so they can't be in such a function. A "
         "program changes a model's fields with `update` and `ema(mut avg, m, decay)` (no statement "
         "assigns a field; `load(path, mut m)` reads a checkpoint in the controller, and is no "
         "device work).",
         "devices cuda[0 1 2]\n\ndim D = 4\ndim C = 3\n\nmodel M:\n    param w: [D C] = normal(std=0.02)\n\n"
         "data Ex:\n    x: [D]\n    y: [] Index[C]\n\n"
         "fn loss(m: M, batch: [b] Ex) -> []:\n    return cross_entropy(batch.x @ m.w, batch.y, over=C)\n\n"
         "fn fit(mut m: M, mut opt: AdamW[M], data: Dataset[Ex]):\n"
         "    for batch in data |> batches(64):\n        l, g = value_and_grad(loss, m, batch)\n"
         "        update(mut m, mut opt, g)\n",
         "Put the device work in a function of its own, as the README's `train_step`, and call it "
         "from the loop. If a step of device work runs in the controller because it prints, saves "
         "or writes to a sink, the error points at that: move it out to the loop that calls the "
         "step, and have the step return the values it needs."),
    Code("E1804", "A whole value where a function takes a split one",
         "A function on the devices is compiled once. If one call gives it a value with the batch "
         "axis, its parameter is split across the devices, and every call must give it one; a value "
         "without the batch axis is whole on every device.",
         "devices cuda[0 1]\n\ndim D = 4\n\nmodel M:\n    param w: [D D] = normal(std=0.02)\n\n"
         "data Ex:\n    x: [D]\n\nfn double(x: [n D]) -> [n D] = x * 2\n\n"
         "fn both(m: M, batch: [b] Ex) -> [D D]:\n    a = double(batch.x)\n    return double(m.w)\n",
         "Call a function of its own for whole values."),
    Code("E1805", "Standalone build for several devices",
         "On several devices a program runs in a controller that starts a worker per device, and "
         "those are the shapescript package's runtime; a module built with `--standalone` doesn't "
         "use the package, so it can only run on one device. (Raised by `shapescript build "
         "--standalone`.)",
         "devices cuda[0 1 2]\n\nfn double(x: [n]) -> [n] = x * 2\n",
         "Build without `--standalone`, or for one device."),
    Code("E1806", "More devices than can run",
         "A devices line names devices that a machine or a cluster has. torch numbers each "
         f"machine's CUDA devices from 0 to {MAX_CUDA_INDEX}, and a program runs on at most {MAX_DEVICES:,} devices "
         "in all (hosts × the devices on each), more than any cluster holds. A line beyond either "
         "is refused when the program is checked, rather than when its workers start: `--devices` "
         "and `ss.load(..., devices=...)` are checked the same way.",
         "devices 1000000 x cuda[0 1 2 3 4 5 6 7]\n\nfn double(x: [n]) -> [n] = x * 2\n",
         "Write the hosts and the devices on each that your machines have, numbering CUDA devices as "
         "`nvidia-smi` lists them."),
]

# E1906's example: a step whose params alone (4 MiB of f32) are more than a device's 1 MiB
_BIG_ON_A_BUDGET = """devices cpu[0 1]
    layout auto
    memory 1 MiB

dim D = 1024

data Row:
    x: [D]

model Big:
    param w: [D D] = normal(std=0.02)

fn loss(m: Big, batch: [b] Row) -> [] = mean(sum((batch.x @ m.w) ** 2, over=D), over=b)

fn train_step(mut m: Big, mut opt: AdamW[Big], batch: [b] Row) -> []:
    l, g = value_and_grad(loss, m, batch)
    update(mut m, mut opt, g)
    return l
"""

_ENTRIES.append(Code(
    "E1901", "Split data given to a Python call",
    "Python calls run once, in the controller. Given a batch, or a value with its batch axis, a "
    "Python call would gather every device's part of the batch through the controller at each "
    "step; that includes a batch of the controller's own loop over `batches(n)`, which goes to the "
    "devices in parts.",
    "devices cpu[0 1]\n\ndim D = 4\n\ndata Ex:\n    x: [D]\n\n"
    "python fn augment(x: [b D]) -> [b D] = \"augment.random_crop\"\n\n"
    "fn show(data: Dataset[Ex]):\n    for batch in data |> batches(8):\n        print(augment(batch.x))\n",
    "Prepare examples in the dataset, as it loads them, or declare the function with `extern fn`, "
    "which works on each example and so runs on the devices."))
_ENTRIES.extend([
    Code("E1902", "A split the devices don't divide",
         "`split H` gives each device an equal block of H: with N devices each holds H / N of every "
         "value with that axis, so N must divide H's size.",
         "devices cpu[0 1 2 3 4]\n    split H\n\ndim H = 12\ndim Dh = 64\n",
         "Use a number of devices that divides the dim (for H = 12: 2, 3, 4 or 6), or split another dim."),
    Code("E1903", "A second split",
         "A program splits its values along one dim at most: each value is cut one way across the "
         "devices.",
         "devices cpu[0 1]\n    split H\n    split Dh\n\ndim H = 12\ndim Dh = 64\n",
         "Keep one `split`."),
    Code("E1904", "A split of something that isn't a dim",
         "`split NAME` names a dim declared with `dim`, such as the attention heads' `H`; the values "
         "with an axis of that size are the ones split.",
         "devices cpu[0 1 2]\n    split Q\n\ndim H = 12\n",
         "Name a declared dim."),
    Code("E1905", "`layout auto` beside a layout of its own",
         "`layout auto` asks the compiler to choose the layout (data parallel, `shard params`, a "
         "`split`, or a split with `shard params`); a `shard params` or `split` line beside it "
         "would choose it too.",
         "devices cpu[0 1]\n    layout auto\n    shard params\n\ndim D = 4\n",
         "Keep `layout auto`, or the layout you wrote and not `layout auto`."),
    Code("E1906", "No layout fits the devices' memory",
         "With `memory` under the devices line, each device may hold that much: the params, the "
         "optimizer's state and the gradients of the models the program trains, and an estimate of "
         "a step's activations, as `shapescript comms` counts them. `layout auto` chooses among the "
         "layouts that fit; when none does, or when the layout written doesn't, the program doesn't "
         "compile, and the error says what each layout would need.",
         _BIG_ON_A_BUDGET,
         "Give more memory or more devices, make the model smaller, or let more of it be split "
         "(`layout auto` tries `shard params` and a split of every dim the devices divide)."),
])
CHAPTERS["19"] = "Python calls and layout options on several devices"

# What a program, its input or its machine gets wrong at run time: no code, a typed exception with
# the .ss location where there is one. (situation, what is raised), rendered in docs/errors.md.
RUN_TIME = [
    ("a value's shape or dtype differs from its declared type: an argument from Python, a loaded item, "
     "a `python`/`extern` fn's result (checked wherever the module runs: one device, the workers, a "
     "standalone build)", "`ShapeError` naming the .ss location and where each dim was bound"),
    ("a label outside `Index[C]`, a bad optimizer setting (`lr=\"fast\"`, NaN, negative, betas not two "
     "numbers in [0, 1))", "`DomainError` naming the value"),
    ("a checkpoint whose header has a setting of the wrong type or range, a step count below 0, a "
     "param index out of range, or keys missing or extra", "`DomainError` or `ShapeError` naming the file "
     "and the key, before the model or optimizer changes"),
    ("`batch_norm` in `Train` over a batch of one example", "`ShapeError` naming the .ss line, on one "
     "device and on several alike"),
    ("a model bigger than the memory (`dim D = 10000000000` and a param `[D D]`)", "`DeviceError` at "
     "`init`, before anything is allocated, with the size and the biggest member"),
    ("`devices cuda` or `cuda[0 1 2]` where fewer CUDA devices are visible", "the program loads; `init`, "
     "or the first call of a function that needs the devices, raises `DeviceError` saying how many are "
     "visible, before any worker starts: a function on the devices at its call, one in the controller as "
     "it first calls one on them (on one device, at its call if it or a function it calls holds tensors). "
     "A function in the controller that only counts, prints numbers or writes them to a sink runs"),
    ("a meta or sparse tensor as an argument or a batch's field", "`ShapeError` naming the parameter or "
     "field and its .ss location"),
    ("`ss.Batch(...)` with a wrong field, or `lengths=` that aren't one whole number per example for a "
     "generic dim of the fields (a list, a float tensor, an unknown dim, one length for two rows)",
     "`ShapeError` as the batch is made, the same on any device count"),
    ("`ss.Batch(..., lengths=)` with a length below 0 or past the size the fields are padded to",
     "`DomainError` naming the dim, the row and the range"),
    ("`ss.adamw(m, lr=10**400)`, or such a number in a checkpoint's header; a header nested 100,000 deep",
     "`DomainError` naming the setting; `ShapeError` saying the file isn't a ShapeScript checkpoint"),
    ("a dataset whose `__len__` Python can't use (-1, 2**63), one too big to `shuffle` here (2**62 items), "
     "or a seed torch can't take", "`DomainError` naming `batches` or `shuffle` and the size"),
    ("`ss.load(None)`, bytes, a number", "`TypeError` saying what `load` takes"),
    ("`dims=` with a size of 1.5, `True`, `\"3\"` or a tensor; 0 or negative", "`TypeError`; "
     "`ValueError` naming the dim"),
    ("`dims=` (or `--dim`) replacing a size the program declares", "it is replaced, with a `UserWarning` "
     "that lists each replaced size and where it was declared"),
    ("`dims=` (or `--dim`) giving a size to a dim defined from others (`dim D = H * Dh`), even an equal "
     "one", "E0202 at the dim, whose help names the dims to size instead"),
    ("a folder where a program, a checkpoint or `build -o`'s output is expected; a missing file",
     "`IsADirectoryError`; `FileNotFoundError`, naming the path (the command line: one line, exit 2)"),
    ("`ss.collective_timeout(inf)`, NaN, more than 7 days; the same in "
     "`$SHAPESCRIPT_COLLECTIVE_TIMEOUT`", "`ValueError`"),
    ("several devices: an `extern fn` naming the script the controller runs (`\"train.double\"` from "
     "`python train.py`)", "an `ImportError` as the workers load the program; they never import that "
     "script (in the controller, on one device, the name is the running `__main__`)"),
    ("several devices: a worker dies, or is killed", "`WorkerError` at once, naming the worker and how it "
     "stopped; the others are stopped"),
    ("several devices: an error on one worker only (an `extern fn` refusing one example)", "that error, at "
     "once, as one device raises it; workers waiting for it at a collective are stopped"),
    ("several devices: the workers don't meet at a collective within the timeout, or all are stopped "
     "(SIGSTOP)", "`WorkerError` saying where each worker was"),
    ("several devices: a handle whose workers have stopped", "`WorkerError` at once; no workers start"),
    ("several devices: a call from a process forked from the controller", "`WorkerError`: the workers "
     "are the parent's, and the child's exit leaves them running"),
    ("several hosts (`devices 2 x cuda[0 1]`) with no cluster to run on", "`ClusterNeededError` (a "
     "`WorkerError`) at the first call or `init`, saying how to give a cluster; compiling, checking and "
     "the DeviceTable need none"),
    ("`ss.cluster(...)` or `%shapescript cluster` without Ray installed", "`RayNotInstalledError` (a "
     "`WorkerError`) saying `pip install 'shapescript[ray]'`"),
    ("`ss.cluster(...)` to an address where no cluster answers", "`WorkerError` naming the address and "
     "Ray's reason"),
    ("`ss.cluster(address, runtime_env=...)` after Ray was connected by a `ray.init` of one's own",
     "`ValueError`: Ray takes a runtime_env only as a process connects; the current cluster is unchanged"),
    ("on a cluster: a worker can't import an `extern fn`'s module (it is only on the controller's machine)",
     "`ExternImportError` naming the .ss line, the module, the worker, its device and host, and how to "
     "ship it (`runtime_env={\"py_modules\": [...]}`) or install it"),
    ("on a cluster: a worker's actor dies, or its node is lost", "`WorkerError` at once, naming the worker, "
     "its device, host and node address, and Ray's cause; the others are stopped"),
    ("on a cluster: no room for the devices line's devices", "`WorkerError` after 120 s saying what the "
     "placement group needs and what is free"),
]

CODES: dict[str, Code] = {c.code: c for c in _ENTRIES}
BUILD_ONLY = {"E1805", "E0313"}  # raised when building, not when checking
NO_PYTHON_ONLY = {"E0701"}  # raised when checking with Python refused (`check_source(..., python=False)`)


def explain(code: str) -> str:
    c = CODES.get(code.upper())
    if c is None:
        raise KeyError(code)
    example = "\n".join("    " + line if line else "" for line in c.example.rstrip("\n").split("\n"))
    return f"{c.code}: {c.title}\n\n{c.explanation}\n\nFor example:\n\n{example}\n\n{c.fix}\n"


def markdown() -> str:
    out = ["# Error index", "",
           "Every diagnostic has a code: E for an error, W for a warning (the program still runs), then "
           "two digits of chapter and two of entry. "
           "`shapescript explain CODE` prints the entry. Each example below is compiled by the tests, "
           "which check that it fails with exactly its code (a warning's: that it compiles, warning of "
           "exactly its code).", "",
           "A diagnostic shows text of the program's (its source line, a name, a string, the file's "
           "name) as text, wherever it is shown: in a terminal, an editor or a notebook. A control "
           "character in it (ESC, BEL, a carriage return, NUL, DEL, C1 controls, the bidirectional "
           "controls, line separators: every character Python calls unprintable, save a tab) is "
           "written as its escape, `\\x1b` or `\\u202e`, and the caret under the line stays under "
           "the character it points at; so a comment holding `ESC [2J` can't clear the screen that "
           "shows its error. Errors and warnings of the command line, the language server and the "
           "notebook, and run-time messages naming a .ss file, follow the same rule.", ""]
    chapter = None
    for c in _ENTRIES:
        if c.code[1:3] != chapter:
            chapter = c.code[1:3]
            out += [f"## {CHAPTERS[chapter]}", ""]
        # The fence's tag says how the docs' tests check the example (see tests/docs/test_doc_snippets.py).
        tag = ("ss-warning" if c.severity is Severity.WARNING else
               "ss-build-error" if c.code in BUILD_ONLY else
               "ss-no-python-error" if c.code in NO_PYTHON_ONLY else "ss-error")
        fence = f"```{tag} {c.code}"
        out += [f"### {c.code}: {c.title}", "", c.explanation, "", fence, c.example.rstrip("\n"), "```", "",
                c.fix, ""]
    out += ["## At run time", "",
            "A program that compiles can still meet bad input or a machine that can't give what it asks. "
            "Each case is an exception that says what is wrong (ShapeScript's own derive from "
            "`ss.ShapeScriptError`), never a traceback from ShapeScript's internals, and nothing is "
            "half-changed. On several "
            "devices, the same case gives the same exception as on one.", "",
            "| situation | what you get |", "|---|---|"]
    out += [f"| {situation} | {result} |" for situation, result in RUN_TIME]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
