"""Model sources -> weights, config and tokenizer; the `wicore-export` command."""
