"""Running a step: SchedulerOutput -> BatchMetadata -> model forward -> logits."""
