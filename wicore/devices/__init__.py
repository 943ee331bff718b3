"""Where graphs run: the execution-provider capability table (`providers`), the placement of
partitions on devices (`placement`), tensors allocated in a session's arena (`device_alloc`)
and page-locked host memory (`pinned`)."""
