"""llama.cpp's enum llama_pooling_type (the GGUF key {arch}.pooling_type) and the pooler's names for its values."""
POOLING_TYPES = {1: "MEAN", 2: "CLS", 3: "LAST"}
