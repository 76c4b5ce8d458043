"""pitstop-slurm-agent: runs on the Slurm controller and executes Pitstop's commands.

The package: text.py (reading scontrol/squeue/sinfo output), commands.py (the closed set of
operations, and how the parts that do them are divided and composed), access.py (the one way to
Slurm), nodes.py, jobs.py and capacity.py (node fences, jobs, capacity), checks.py and the check
parts beside it (check runs on a fenced node or beside a job), ledger.py (the SQLite claim
ledger), loop.py (claim, execute, answer), cli.py (arguments, main). The wire protocol it shares
with actuate is pitstop.core.slurm_wire.

It pulls commands from its cluster's Pub/Sub subscription (outbound connections only: a
private cluster needs no inbound path), executes a closed set of operations with
scontrol/scancel/squeue (argument lists, never a shell; every argument validated), and
publishes each state of each command to its cluster's results topic
(``pitstop-slurm-<cluster>-results``), which only this cluster's agent may publish to.
actuate pulls that topic's subscription and merges the results into Firestore
(``<prefix>_slurm_results/<command id>``), forward only; the agent itself holds no Firestore
access at all. Why an agent and not slurmrestd: its REST API has no requeue in any version up
to v0.0.42 and no node update before v0.0.39.

Exactly once. Pub/Sub delivers a command at least once, actuate republishes the same command
id on every retry, and streaming pull runs callbacks concurrently, so the agent claims a
command before it runs it (the pattern idempotency libraries use: record "in progress" under a
precondition, act, record the result). Each command id is one step of core/steps.StepRunner,
the runner actuate and notify use; its store is a local SQLite ledger (``--ledger``, one row per
command id with a ``version`` bumped on every write; ledger.LedgerSteps reads the rows as step
records):

1. Insert the row as ``running`` with an owner, a claim token and ``claim_until``
   (``INSERT OR IGNORE``: exactly one insert of a command id succeeds).
2. A delivery whose insert is ignored reads the row: ``done`` or ``failed`` (final) → the answer
   is known: it is published again (so a result message that was lost is recovered) and nothing
   runs; ``running`` within its claim → another delivery is executing it, so this one is
   acknowledged and left (the result appears when that one finishes); ``transient`` (the last
   attempt hit a passing Slurm hiccup) or ``running`` past its claim (its agent died) → taken
   over by an UPDATE conditioned on the row's version (only one taker wins; the others see no
   row updated and leave).
3. Run the command, then write the final state, again conditioned on the version of the claim,
   so an agent that lost its claim never overwrites the next attempt's answer.

Every state written (running, transient, done, failed) is published as the whole row, JSON,
with attributes ``id`` and ``state`` and the command id as ordering key. A final state is
published before the command's message is acknowledged; if that publish fails the message is
redelivered and step 2 publishes the answer again. Rows older than ``KEEP_S`` are deleted at
start and hourly: every command expires within minutes, so a copy that old is never run.

The claim (``CLAIM_S``) outlasts the longest command (its subprocesses' timeouts), so a live
agent is never overtaken. A command past its deadline is refused if it was never seen, and
ignored if it was (a fresher copy carries the retry); it is never run.

Failures: ``transient`` for a passing hiccup (slurmctld unreachable or slow, a timeout, a
controller in standby, "try again"): a retry runs a new attempt. ``failed`` for everything
else (refused commands, invalid node, unknown job, unexpected output): replayed, never re-run.

Fences: Pitstop drains with the reason ``pitstop <incident> <action>`` and lifts only that. A
node someone else drained (or failed) keeps its state and reason; a node that is only DOWN
(which Slurm itself returns to service when its slurmd registers again) gets Pitstop's drain
on top, with the previous reason kept in the new one.

Capacity (``capacity``, read-only): whether a job's gang could start again now without the
fenced node: idle, responding, undrained nodes of its partition outside any active reservation,
plus the job's own healthy nodes (they free up when it is requeued), against its node count.
A count, not a promise: GRES, features and higher-priority pending jobs are not weighed.

Checks on a fenced node (``start_check``, ``check_result``). Slurm never starts a job on a DRAIN
node, whatever reservation the job names (checked on 22.05: it stays pending with
ReqNodeNotAvail), and a person's or Pitstop's drain is the only fence Slurm has. So the agent
swaps the fence for a reservation, for the length of the check only:

1. ``scontrol create reservation ReservationName=<check name> Users=<agent user>
   Nodes=<node>[,<peer>] StartTime=now Duration=UNLIMITED Flags=MAINT``. MAINT lets it overlap
   a reservation the node already sits in, and an overlapping MAINT reservation keeps that
   reservation's jobs off the node too (checked: "Required nodes outside of the reservation").
   Without IGNORE_JOBS, so a peer that got busy since it was picked fails the creation and the
   next idle peer is tried. UNLIMITED, so an agent that died mid-check leaves the node reserved
   (out of everyone's reach), never free.
2. Only then the node is resumed: reserved for the agent's user, it takes only jobs that name
   the reservation.
3. ``sbatch`` a holder job named after the check (``--reservation``, ``-w``, ``--exclusive``,
   a time limit per DCGM level), which sleeps; the tools run as job steps in it (``srun
   --jobid --overlap``), started by a runner process the agent spawns (``--run-check``), so
   each tool's stdout comes back to the controller over srun's own I/O: no shared filesystem.
4. When the tools are done (or the job ended, or its time ran out) the node is drained again
   with exactly the reason it had before, then the job is cancelled, and once it has left the
   node the reservation is deleted. The drain comes first, so the node is never unfenced
   and unreserved at once; a node someone drained meanwhile keeps their drain.

Every step is idempotent and recorded in ``<check dir>/<name>/state.json``: a start delivered
again answers what the first one started (the job is also found by name in squeue), and a
start interrupted midway continues where it stopped. ``check_result`` is a fresh probe: not
done while the runner lives; a runner that died (an agent restart under systemd kills it) is
started again while the job runs, else the check ends with an error. Creating reservations
takes root or SlurmUser, which the agent runs as (the systemd unit runs it as root).

Checks across a hung job (``start_gang_check``, ``gang_check_result``; gang.py): the same runner,
but the tools run as steps of the running job itself on every one of its nodes at once (or on
ring pairs, for the NCCL test), so nothing is drained or reserved and the job keeps its nodes.
"""

from __future__ import annotations

import time  # tests move the agent's clock through it

from pitstop.agent.slurm.access import CheckTools, SlurmAccess, run_subprocess
from pitstop.agent.slurm.checks import check_minutes, check_steps
from pitstop.agent.slurm.cli import commands_for, main, parse_args, results_topic, run_check_main
from pitstop.agent.slurm.commands import SlurmCommands
from pitstop.agent.slurm.ledger import Ledger
from pitstop.agent.slurm.loop import Agent, ResultSink, ResultsTopic
from pitstop.agent.slurm.text import (
    CLAIM_S,
    DEFAULT_LEDGER,
    JOB,
    KEEP_S,
    CommandRefusedError,
    NodeInfo,
    SlurmOutputError,
    is_transient,
    job_leader,
    parse_node,
    parse_nodes,
    parse_reservations,
)

__all__ = [
    "CLAIM_S",
    "DEFAULT_LEDGER",
    "JOB",
    "KEEP_S",
    "Agent",
    "CheckTools",
    "CommandRefusedError",
    "Ledger",
    "NodeInfo",
    "ResultSink",
    "ResultsTopic",
    "SlurmAccess",
    "SlurmCommands",
    "SlurmOutputError",
    "check_minutes",
    "check_steps",
    "commands_for",
    "is_transient",
    "job_leader",
    "main",
    "parse_args",
    "parse_node",
    "parse_nodes",
    "parse_reservations",
    "results_topic",
    "run_check_main",
    "run_subprocess",
    "time",
]
