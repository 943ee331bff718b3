"""WiCore on Ray Serve: engine replicas behind one OpenAI endpoint (docs/DEPLOY.md).

Imports ray: only `wicore serve --replicas / --ray-address` (wicore.cli.cluster) loads it.
"""
