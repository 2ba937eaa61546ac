"""SamplingParams and the batched sampler (beam search too)."""
