"""Accelerator names as SkyPilot spells them, from what each cloud's API calls them.

AWS's DescribeInstanceTypes names a GPU by manufacturer and model and gives its memory; two memory sizes
of one model are two accelerators to a user (an A100 with 80 GB is ``A100-80GB``), so the memory is part of
the key. GCP names accelerator types (``nvidia-tesla-t4``) and says nothing of their memory, so its table
carries the memory too.
"""

from __future__ import annotations

# (model as AWS names it, memory per GPU in MiB) -> canonical name; a model absent here keeps its own name
# with spaces dropped (see ``canonical_aws_gpu``), whatever its memory.
AWS_GPU_NAMES: dict[tuple[str, int], str] = {
    ("A100", 40960): "A100",
    ("A100", 81920): "A100-80GB",
    ("V100", 16384): "V100",
    ("V100", 32768): "V100-32GB",
}
AWS_MODEL_NAMES: dict[str, str] = {
    "RTX PRO Server 6000": "RTXPRO6000",
    "RTX PRO 4500": "RTXPRO4500",
    "Qualcomm AI100": "AI100",
}

# GCP accelerator type -> (canonical name, memory per GPU in GiB), from Compute Engine's GPU platforms page.
GCP_ACCELERATORS: dict[str, tuple[str, float]] = {
    "nvidia-tesla-t4": ("T4", 16.0),
    "nvidia-tesla-v100": ("V100", 16.0),
    "nvidia-tesla-p100": ("P100", 16.0),
    "nvidia-tesla-p4": ("P4", 8.0),
    "nvidia-tesla-k80": ("K80", 12.0),
    "nvidia-l4": ("L4", 24.0),
    "nvidia-tesla-a100": ("A100", 40.0),
    "nvidia-a100-80gb": ("A100-80GB", 80.0),
    "nvidia-h100-80gb": ("H100", 80.0),
    "nvidia-h100-mega-80gb": ("H100-MEGA", 80.0),
    "nvidia-h200-141gb": ("H200", 141.0),
}


def canonical_aws_gpu(model: str, memory_mib: int) -> str:
    """The canonical name of a GPU (or Neuron device) DescribeInstanceTypes reports as ``model`` with
    ``memory_mib`` each: ``("A100", 81920)`` -> ``A100-80GB``, ``("T4", 16384)`` -> ``T4``."""
    known = AWS_GPU_NAMES.get((model, memory_mib))
    if known is not None:
        return known
    return AWS_MODEL_NAMES.get(model, model.replace(" ", ""))


def canonical_gcp_accelerator(accelerator_type: str) -> tuple[str, float]:
    """The canonical name and per-GPU memory (GiB) of a Compute Engine accelerator type; an unknown type
    keeps its own name with an unknown (0) memory rather than being dropped."""
    return GCP_ACCELERATORS.get(accelerator_type, (accelerator_type, 0.0))


def is_same_accelerator(asked: str, canonical: str) -> bool:
    """Whether a task's accelerator name means ``canonical``: names match in any case (``a100-80gb``)."""
    return asked.casefold() == canonical.casefold()
