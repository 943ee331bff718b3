"""profile_step with the WebGPU EP's maxNumPendingDispatches (dispatches encoded before a queue submit) set: argv[1]."""
import dataclasses
import sys

import profile_step
from benchlib import run_tool
from wicore.devices import providers

cap = providers.CAPABILITIES["webgpu"]
providers.CAPABILITIES["webgpu"] = dataclasses.replace(cap, options=(("maxNumPendingDispatches", sys.argv[1]),))
sys.exit(run_tool(sys.argv[2:], profile_step.parse_args, profile_step.run))
