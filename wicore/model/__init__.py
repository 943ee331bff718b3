"""What describes a model, whatever reads or writes it: config, tokenizer facts, weight protocol and formats."""
