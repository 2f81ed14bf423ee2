"""The figures the Optimus paper publishes for the settings in examples/optimus/ (Feng et al.,
"Optimus: Accelerating Large-Scale Multi-Modal LLM Training by Bubble Exploitation", USENIX ATC'25,
arXiv 2408.03505): one place for the benches that compare pybubble with them."""

from __future__ import annotations

PEAK_FLOPS = 989e12
"""The paper's per-GPU peak (H100, dense BF16), the denominator of its MFU."""

STRONG_3072 = {  # Table 5: ViT-22B + GPT-175B, global batch 1536, 3072 GPUs
    "megatron": {"step_s": 5.91, "mfu": 0.285, "pflops": 866.3},
    "megatron_balanced": {"step_s": 5.87, "mfu": 0.287, "pflops": 872.2},
    "optimus": {"step_s": 4.87, "mfu": 0.346, "pflops": 1051.3},
}
"""The 3072-GPU row: iteration time, MFU and aggregate PFLOP/s per method."""

EFFICIENCY = {  # Table 7: share of the encoder's computation inside LLM bubbles (simulated)
    "strong_1536": {"microbatches": 32, "coarse": 0.343, "fine": 0.575, "scheduler_s": 322.2},
    "strong_2048": {"microbatches": 24, "coarse": 0.458, "fine": 0.693, "scheduler_s": 89.6},
    "strong_3072": {"microbatches": 16, "coarse": 0.687, "fine": 0.850, "scheduler_s": 15.1},
}
"""Scheduling efficiency, coarse-grained only and with the fine kernel-level step, and the run time
of Optimus's whole plan search on one CPU core, per strong-scaling config."""

DUAL_SPEEDUP = {"dual_1": 1.25, "dual_2": 1.26, "dual_3": 1.27}
"""Table 6: Optimus over Megatron-LM with two encoders."""

WEAK_BEST = {"megatron": 1.22, "megatron_balanced": 1.18}
"""Weak scaling (settings A-D): Optimus's best speed-up over each baseline."""

A100 = {"vs_alpa": 3.09, "vs_fsdp": 1.151}
"""App. C (8 A100s): Optimus over Alpa and over PyTorch FSDP (baselines pybubble does not model)."""

MFU_FLAT = 0.345
"""The paper's Optimus MFU is about flat over the three strong-scaling sizes."""
