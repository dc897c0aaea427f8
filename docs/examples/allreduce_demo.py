import torch

from gpulayer.runtime import Runtime

with Runtime(accelerator="cpu") as rt:
    total = rt.all_reduce(torch.tensor([rt.global_rank + 1.0]))
    if rt.is_global_zero:
        print(f"{rt.placement!r}: sum over ranks = {total.item()}")
