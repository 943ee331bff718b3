"""Where graphs run: the execution-provider capability table (`providers`, free memory in
`free_memory`), the placement of partitions on devices (`placement`), tensors allocated in a
session's arena (`device_alloc`; in MIGraphX, CANN and DirectML memory behind `device_pools`),
page-locked host memory (`pinned`), and which nodes each EP would take (`doctor`, over
`graph_nodes` and the published lists of `op_tables`)."""
