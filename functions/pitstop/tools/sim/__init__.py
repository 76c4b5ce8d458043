"""`pitstop simulate`: a discrete-event model of a training fleet under faults.

The Pitstop strategy's decisions come from the real classifier and incident engine
(core/classify.py, core/engine.py); the other strategies are simple models of what their
systems are documented to do (reference/peers.md).
"""
