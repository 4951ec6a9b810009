"""The paper's experiments as commands: PTQ (ptq.py), QAT (qat.py) and ActorQ (actorq.py) studies, plots (plots.py)."""
