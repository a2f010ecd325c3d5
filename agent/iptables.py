"""One address family's filter table (iptables or ip6tables), read and written for the fence (network.py).

``table_read`` reads a whole table once (``-S``; the filter table unless said); ``table_apply`` applies a
batch of changes in one transaction (``iptables-restore --noflush``), so moving a
rule to the top of its chain never leaves a moment without it. ``Table.accepting``
answers the order question: could a rule before a given position accept a packet
arriving from an interface, directly or through the chains it jumps to.
The commands act on the network namespace the process lives in.
"""

import ipaddress
import shlex
import shutil
import subprocess
from dataclasses import dataclass

Rule = tuple[str, ...]


@dataclass(frozen=True)
class Family:
    name: str
    command: str
    version: int


IPV4 = Family("IPv4", "iptables", 4)
IPV6 = Family("IPv6", "ip6tables", 6)
REPLIES = {"ESTABLISHED", "RELATED"}


class IptablesError(Exception):
    """A command failed (not installed, no kernel support, a rule it refused, a table changed under a batch)."""


@dataclass
class Table:
    chains: dict[str, list[Rule]]

    def find(self, chain: str, rule) -> int | None:
        """Position (from 0) of the first copy of ``rule`` in ``chain``."""
        wanted = canonical(rule)
        return next((i for i, r in enumerate(self.chains.get(chain, [])) if canonical(r) == wanted), None)

    def count(self, chain: str, rule) -> int:
        wanted = canonical(rule)
        return sum(canonical(r) == wanted for r in self.chains.get(chain, []))

    def holds(self, chain: str, rules) -> bool:
        """Whether ``chain`` holds exactly ``rules``, in order."""
        return [canonical(r) for r in self.chains.get(chain, [])] == [canonical(r) for r in rules]

    def accepting(self, chain: str, interface: str, *, before: int, ignore=()) -> Rule | None:
        """The first rule before position ``before`` that may accept new traffic from ``interface``."""
        ignored = {canonical(r) for r in ignore}
        for rule in self.chains.get(chain, [])[:before]:
            if canonical(rule) not in ignored and self._may_accept(rule, interface, seen={chain}):
                return rule
        return None

    def _may_accept(self, rule: Rule, interface: str, seen: set[str]) -> bool:
        if not _matches_interface(rule, interface) or _replies_only(rule):
            return False
        target = _option(rule, "-j") or _option(rule, "-g")
        if target == "ACCEPT":
            return True
        if target not in self.chains or target in seen:
            return False  # DROP, REJECT, RETURN, LOG, MARK...: no verdict that lets the packet through
        return any(self._may_accept(r, interface, seen | {target}) for r in self.chains[target])


def available(family: Family) -> bool:
    return shutil.which(family.command) is not None


def table_read(family: Family, table: str = "filter") -> Table:
    """A table (the filter table unless said: the gangs' NAT exemption is in ``nat``) as ``-S`` prints it."""
    listed = _run([family.command, "-w", "-t", table, "-S"])
    chains: dict[str, list[Rule]] = {}
    for line in listed.splitlines():
        words = shlex.split(line)
        if len(words) >= 2 and words[0] in ("-P", "-N"):
            chains.setdefault(words[1], [])
        elif len(words) >= 2 and words[0] == "-A":
            chains.setdefault(words[1], []).append(tuple(words[2:]))
    return Table(chains)


def table_apply(family: Family, lines: list[str], table: str = "filter") -> None:
    """Apply ``lines`` (iptables-restore syntax for ``table``) atomically, all or nothing."""
    _run([f"{family.command}-restore", "-w", "--noflush"], stdin="\n".join([f"*{table}", *lines, "COMMIT", ""]))


def _run(command: list[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IptablesError(f"{command[0]}: {exc}") from exc
    if done.returncode != 0:
        raise IptablesError(f"{command[0]}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done.stdout


def canonical(rule) -> tuple[str, ...]:
    """A rule's words as comparable values: iptables prints addresses, ctstates and options its own way."""
    words = []
    for word in rule:
        if "/" in word or ":" in word or word.count(".") == 3:
            try:
                word = str(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
        if "," in word:
            word = ",".join(sorted(word.split(",")))
        words.append(word)
    return tuple(sorted(words))


def _option(rule: Rule, flag: str) -> str | None:
    return rule[rule.index(flag) + 1] if flag in rule[:-1] else None


def _negated(rule: Rule, flag: str) -> bool:
    position = rule.index(flag)
    return position > 0 and rule[position - 1] == "!"


def _matches_interface(rule: Rule, interface: str) -> bool:
    pattern = _option(rule, "-i")
    if pattern is None:
        return True
    matches = pattern == interface or (pattern.endswith("+") and interface.startswith(pattern[:-1]))
    return matches != _negated(rule, "-i")


def _replies_only(rule: Rule) -> bool:
    """Matches only packets of connections already accepted (the fence's own first rule lets these through)."""
    for flag in ("--ctstate", "--state"):
        states = _option(rule, flag)
        if states is not None and not _negated(rule, flag) and set(states.split(",")) <= REPLIES:
            return True
    return False
