"""Everything generated code calls, in one namespace (`_rt` in a built module)."""

from shapescript.runtime.autodiff import value_and_grad
from shapescript.runtime.calls import python_call, show
from shapescript.runtime.checkpoint import load, save
from shapescript.runtime.collectives import (
                                              all_batch_norm,
                                              all_cross_entropy,
                                              all_masked_cross_entropy,
                                              all_masked_mean,
                                              all_mean,
                                              all_sum,
                                              world,
)
from shapescript.runtime.data import Batch, DataSpec, FieldSpec, TensorDataset
from shapescript.runtime.grads import Grads, grad_field
from shapescript.runtime.guards import (  # GUARDS, PYTHON_RESULTS
                                              ArgDims,
                                              AxisCheck,
                                              BatchGuard,
                                              DimFormula,
                                              KindGuard,
                                              NotFromPython,
                                              Param,
                                              ResultGuard,
                                              TensorGuard,
)
from shapescript.runtime.heads import cut_heads, gather_heads
from shapescript.runtime.loops import batches, shuffle
from shapescript.runtime.model import Model, ModelSpec, ParamSpec, SubSpec
from shapescript.runtime.modes import (
                                              Eval,
                                              Mode,
                                              Train,
                                              bernoulli,
                                              categorical,
                                              dropout,
                                              randint,
                                              random_normal,
                                              random_uniform,
)
from shapescript.runtime.ops import (
                                              adaptive_pool,
                                              affine_layer_norm,
                                              batch_norm,
                                              causal,
                                              causal_mask,
                                              clip_norm,
                                              conv,
                                              conv_transpose,
                                              first,
                                              grad_norm,
                                              group_norm,
                                              last,
                                              layer_norm,
                                              masked_cross_entropy,
                                              masked_mean,
                                              masked_sum,
                                              mixed_precision,
                                              pool,
                                              put,
                                              rms_norm,
                                              take,
                                              tf32_products,
                                              topk,
                                              valid,
                                              window,
)
from shapescript.runtime.optim import Optimizer, adamw, ema, sgd, update
from shapescript.runtime.patterns import rearrange, reduce, repeat, split_parts
from shapescript.runtime.products import matmul
from shapescript.runtime.sharding import gather_param
from shapescript.runtime.sinks import Logs, Sink, logs, write

__all__ = ["affine_layer_norm", "ArgDims", "AxisCheck", "BatchGuard", "DimFormula", "KindGuard", "NotFromPython", "Param", "ResultGuard", "TensorGuard", "all_batch_norm", "all_cross_entropy", "all_masked_cross_entropy", "all_masked_mean", "all_mean", "all_sum", "masked_cross_entropy", "matmul", "masked_mean", "masked_sum", "valid", "batch_norm", "Eval", "Mode", "Train", "causal", "causal_mask", "clip_norm", "first", "dropout", "random_normal", "random_uniform", "bernoulli", "randint", "categorical", "gather_param", "gather_heads", "grad_field", "ema", "cut_heads", "world", "grad_norm", "Batch", "DataSpec", "FieldSpec", "Grads", "Logs", "Model", "ModelSpec", "Optimizer", "ParamSpec",
           "Sink", "SubSpec", "TensorDataset", "adamw", "batches", "load", "logs", "python_call", "rearrange", "reduce", "repeat", "save", "sgd",
           "show", "shuffle", "split_parts", "take", "topk", "window", "last", "conv", "pool", "put", "conv_transpose", "adaptive_pool", "layer_norm", "rms_norm", "group_norm", "mixed_precision", "tf32_products", "update", "value_and_grad", "write"]
