"""Training for the paper's experiments (SPEC §5): the trainer, checkpoints, data parallelism,
and what the example scripts in ``examples/`` share.

* :class:`Trainer`, :class:`TrainConfig`, :func:`evaluate`, :func:`per_sample_errors`,
  :func:`relative_l2_metric`, :func:`predict` (:mod:`.trainer`);
* :func:`save_checkpoint`, :func:`load_checkpoint`, :func:`write_json`, :func:`write_csv`,
  :class:`CheckpointError` (:mod:`.checkpoint`; atomic, ``weights_only``-loadable);
* :func:`setup_distributed`, :func:`cleanup_distributed`, :class:`DistributedContext`
  (:mod:`.distributed`; ``torchrun`` + DDP);
* :func:`experiment_parser`, :func:`resolve_config`, :func:`cached_data`, :func:`plot_1d`,
  :func:`plot_2d`, :func:`write_metrics`, :func:`describe_device`, :func:`command_line`,
  :func:`threshold_report`, :func:`enforce_thresholds`, :func:`preset_unchanged`,
  :func:`error_summary`, :func:`describe_grid`, :func:`normalizer_config` (:mod:`.experiment`).
"""

from .checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    atomic_write,
    load_checkpoint,
    save_checkpoint,
    write_csv,
    write_json,
)
from .distributed import (
    DistributedContext,
    cleanup_distributed,
    resolve_device,
    setup_distributed,
)
from .experiment import (
    ATTENTION_TYPES,
    ThresholdError,
    cached_data,
    command_line,
    default_cache_dir,
    describe_device,
    describe_grid,
    enforce_thresholds,
    error_summary,
    experiment_parser,
    normalizer_config,
    plot_1d,
    plot_2d,
    preset_unchanged,
    record_data_files,
    resolve_config,
    run_main,
    threshold_report,
    write_metrics,
)
from .trainer import (
    NonFiniteLossError,
    TrainConfig,
    Trainer,
    default_forward,
    evaluate,
    per_sample_errors,
    predict,
    relative_l2_metric,
)

__all__ = [
    "ATTENTION_TYPES",
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "DistributedContext",
    "NonFiniteLossError",
    "ThresholdError",
    "TrainConfig",
    "Trainer",
    "atomic_write",
    "cached_data",
    "cleanup_distributed",
    "default_cache_dir",
    "default_forward",
    "command_line",
    "describe_device",
    "describe_grid",
    "enforce_thresholds",
    "error_summary",
    "evaluate",
    "experiment_parser",
    "load_checkpoint",
    "normalizer_config",
    "per_sample_errors",
    "plot_1d",
    "plot_2d",
    "predict",
    "preset_unchanged",
    "record_data_files",
    "relative_l2_metric",
    "resolve_config",
    "resolve_device",
    "run_main",
    "save_checkpoint",
    "setup_distributed",
    "threshold_report",
    "write_csv",
    "write_json",
    "write_metrics",
]
