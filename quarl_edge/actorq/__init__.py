"""ActorQ: distributed actor-learner training on Ray with quantized actors (QuaRL, Sec. 5).

`quarl_edge.actorq.dqn` / `.d4pg` (learners, Args), `.loop` (the shared actor-learner loop), `.actors`
(Ray actors, LapTimer), `.broadcast` (quantize_broadcast), `.plots`. The CLI is quarl_edge/cli/actorq.py,
the study quarl_edge/study/actorq.py. Not imported here: the CLI must start without torch.
"""
