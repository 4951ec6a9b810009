"""ActorQ: distributed actor-learner training on Ray with quantized actors (QuaRL, Sec. 5).

`quarl_edge.actorq.dqn` (learner, Args), `.actors` (Ray actors, LapTimer), `.broadcast`
(quantize_broadcast), `.plots`, `.command` (the CLI). Not imported here: the CLI must start without torch.
"""
