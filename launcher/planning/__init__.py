"""The pre-flight estimate: will a run fit its GPUs, how fast will it go, how does it scale."""
