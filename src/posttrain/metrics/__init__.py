"""Where run metrics go: metrics.jsonl always, TensorBoard and W&B when enabled."""

from posttrain.metrics.sinks import MetricSink, open_sinks

__all__ = ["MetricSink", "open_sinks"]
