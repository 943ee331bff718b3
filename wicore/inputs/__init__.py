"""What comes in: text to token ids and chat templates (`tokenizer`), and images decoded and
fetched (`image_loader`)."""
