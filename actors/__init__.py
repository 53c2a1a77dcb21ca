"""The actor runtime: ``GraphRuntime`` over pykka actors — thread actors, supervisor, subscriptions.

Import direction: ``actors`` imports ``domain`` and ``persistence``, never the other way round.
"""

from threadloom.actors.graph import Graph, NodeContext, RunOutcome, Step, merge_input
from threadloom.actors.policies import ChildRetention, ClaimPolicy, ServePolicy, SweepSchedule, WatchPolicy
from threadloom.actors.runs import RunHandle, RunKind
from threadloom.actors.runtime import GraphRuntime
from threadloom.actors.scheduler import IdFactory, RandomIds, Scheduler, SequentialIds, ThreadScheduler
from threadloom.actors.serve import Server
from threadloom.actors.subscription import Subscription
from threadloom.actors.supervisor import Supervisor
from threadloom.actors.thread_actor import ThreadActor

__all__ = [
    "ChildRetention",
    "ClaimPolicy",
    "Graph",
    "GraphRuntime",
    "IdFactory",
    "NodeContext",
    "RandomIds",
    "RunHandle",
    "RunKind",
    "RunOutcome",
    "Scheduler",
    "SequentialIds",
    "ServePolicy",
    "Server",
    "Step",
    "Subscription",
    "Supervisor",
    "SweepSchedule",
    "ThreadActor",
    "ThreadScheduler",
    "WatchPolicy",
    "merge_input",
]
