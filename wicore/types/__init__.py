"""The plain data that crosses the package boundaries: how a request samples (`sampling`), what
comes back (`outputs`), images in a prompt (`images`), and the dataclasses of one engine step
(`step`). Public names are re-exported by `wicore` itself."""
