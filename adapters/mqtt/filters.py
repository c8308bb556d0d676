"""The MQTT topic filters one gateway session subscribes to: an antichain planner.

Every WS-N subscription asks for a few MQTT filters (``topic_mapping`` translates its topic
expression).  The gateway's one persistent session cannot simply subscribe to all of them:
a broker may send one copy of a message *per matching subscription of the session*
(Mosquitto does for MQTT 5 clients), so ``a/+/c`` and ``a/b/+`` would bring ``a/b/c``
twice and every WS-N subscriber of it would get it twice.  :class:`FilterSet` therefore
keeps the session's *effective* filters pairwise disjoint (no topic matches two of them):

* a requested filter covered by an effective one is served by it (``a/b`` by ``a/#``);
* one that covers effective filters replaces them;
* two that overlap without either covering the other are replaced by their *join*, a
  filter that covers both (``a/+/c`` and ``a/b/+`` become ``a/+/+``).  The queue store
  routes every arriving message by its topic against the subscriptions' own patterns, so
  a wider filter costs traffic, never a wrong delivery.

Changing the effective set is made safe for messages in flight: a :class:`Change` lists
the filters to subscribe and those to *retire* once every new subscription is
acknowledged (SUBACK).  Until then the old filters are the only source of their topics;
from that point on every such message also comes through a new filter, so copies that come
through a retiring filter (known by its MQTT 5 subscription identifier) are dropped.

Each effective filter has a subscription identifier; a filter keeps it while the broker
knows it under that identifier (``known``), and a filter that comes back while its
retirement is pending gets a new one.  Pure data structures: no I/O, not thread-safe (the
session guards it with its lock).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["MAX_SUBSCRIPTION_ID", "SHARED", "Change", "FilterSet", "covers", "join", "overlaps"]

#: the largest MQTT 5 subscription identifier (a variable byte integer)
MAX_SUBSCRIPTION_ID = 268_435_455
#: how a shared subscription's filter starts (MQTT 5: ``$share/<group>/<filter>``; the
#: dead-letter boxes')
SHARED = "$share/"

_ONE = "+"
_ALL = "#"


def _levels(f: str) -> list[str]:
    return f.split("/")


def covers(a: str, b: str) -> bool:
    """Whether every topic that filter ``b`` matches is matched by filter ``a``."""
    x, y = _levels(a), _levels(b)
    i = 0
    while True:
        if i < len(x) and x[i] == _ALL:
            return True  # a trailing '#' matches the rest, the parent level included
        if i == len(y):
            return i == len(x) or x[i:] == [_ALL]
        if i == len(x) or y[i] == _ALL:
            return False
        if x[i] != _ONE and (y[i] == _ONE or x[i] != y[i]):
            return False
        i += 1


def overlaps(a: str, b: str) -> bool:
    """Whether some topic matches both filters."""
    x, y = _levels(a), _levels(b)
    i = 0
    while True:
        if (i < len(x) and x[i] == _ALL) or (i < len(y) and y[i] == _ALL):
            return True
        if i == len(x) or i == len(y):
            return len(x) == len(y)
        if x[i] != y[i] and x[i] != _ONE and y[i] != _ONE:
            return False
        i += 1


def join(a: str, b: str) -> str:
    """A filter that covers both ``a`` and ``b``: equal levels are kept, differing ones
    become ``+``, and a difference in length (or a ``#``) ends it with ``#``."""
    x, y = _levels(a), _levels(b)
    out: list[str] = []
    for i in range(min(len(x), len(y))):
        if x[i] == _ALL or y[i] == _ALL:
            out.append(_ALL)
            return "/".join(out)
        out.append(x[i] if x[i] == y[i] else _ONE)
    if len(x) != len(y):
        out.append(_ALL)
    return "/".join(out)


class _Node:
    """One level of the trie of effective filters."""

    __slots__ = ("children", "end")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        #: the effective filter that ends at this node
        self.end: str | None = None


class _Trie:
    """Effective filters by level, for the overlap query."""

    def __init__(self) -> None:
        self.root = _Node()

    def add(self, f: str) -> None:
        node = self.root
        for level in _levels(f):
            node = node.children.setdefault(level, _Node())
        node.end = f

    def remove(self, f: str) -> None:
        path = [self.root]
        for level in _levels(f):
            nxt = path[-1].children.get(level)
            if nxt is None:
                return
            path.append(nxt)
        path[-1].end = None
        levels = _levels(f)
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.end is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def overlapping(self, f: str) -> list[str]:
        """Every stored filter that overlaps ``f``."""
        levels = _levels(f)
        found: list[str] = []

        def everything(node: _Node) -> None:
            stack = [node]
            while stack:
                n = stack.pop()
                if n.end is not None:
                    found.append(n.end)
                stack.extend(n.children.values())

        def walk(node: _Node, i: int) -> None:
            deep = node.children.get(_ALL)
            if deep is not None and deep.end is not None:
                found.append(deep.end)  # "x/#" overlaps everything below x, and x itself
            if i == len(levels):
                if node.end is not None:
                    found.append(node.end)
                return
            level = levels[i]
            if level == _ALL:
                for key, child in node.children.items():
                    if key != _ALL:
                        everything(child)
                if node.end is not None:
                    found.append(node.end)  # "x/#" also matches x
                return
            if level == _ONE:
                for key, child in node.children.items():
                    if key != _ALL:
                        walk(child, i + 1)
                return
            exact = node.children.get(level)
            if exact is not None:
                walk(exact, i + 1)
            one = node.children.get(_ONE)
            if one is not None:
                walk(one, i + 1)

        walk(self.root, 0)
        return found


@dataclass
class _Effective:
    """A filter the session subscribes to."""

    filter: str
    id: int
    #: the requested filters it serves
    members: set[str] = field(default_factory=set)
    #: the broker acknowledged it (SUBACK) under this identifier
    acked: bool = False


@dataclass
class Change:
    """What the session must do after a change of the requested filters.

    Subscribe ``subscribe`` (filter, identifier); once the broker acknowledged *all* of
    them, retire ``retire`` (drop their copies, unsubscribe); with nothing to subscribe,
    retire at once.
    """

    subscribe: list[tuple[str, int]] = field(default_factory=list)
    retire: list[tuple[str, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.subscribe or self.retire)

    def merge(self, other: Change) -> None:
        """Add ``other`` to this change (call ``cancel`` when done merging)."""
        self.subscribe.extend(other.subscribe)
        self.retire.extend(other.retire)

    def cancel(self) -> Change:
        """Drop the filters both subscribed and retired within this change: they never
        need to reach the broker.  Returns the change."""
        both = set(self.subscribe) & set(self.retire)
        if both:
            self.subscribe = [s for s in self.subscribe if s not in both]
            self.retire = [r for r in self.retire if r not in both]
        return self


class FilterSet:
    """Requested filters per subscription name, and the disjoint set that serves them.

    ``known`` maps filters the broker already has (from an earlier run) to their
    identifiers; they keep them when they are effective again.  ``next_id`` is the first
    identifier to hand out.
    """

    def __init__(self, known: Mapping[str, int] | None = None, next_id: int = 1) -> None:
        self.known: dict[str, int] = dict(known or {})
        self._next_id = max([next_id, *(i + 1 for i in self.known.values())])
        #: subscription name -> the filters it requested
        self.by_name: dict[str, frozenset[str]] = {}
        #: requested filter -> how many subscriptions requested it
        self.requested: dict[str, int] = {}
        #: requested filter -> the effective filter serving it
        self.owner: dict[str, str] = {}
        self.effective: dict[str, _Effective] = {}
        self._trie = _Trie()

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.effective)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return ((e.filter, e.id) for e in self.effective.values())

    def serving(self, name: str) -> list[tuple[str, int]]:
        """The effective filters (and identifiers) that serve subscription ``name``."""
        out: dict[str, int] = {}
        for f in self.by_name.get(name, ()):
            e = self.effective[self.owner[f]]
            out[e.filter] = e.id
        return list(out.items())

    def is_acked(self, f: str, sid: int) -> bool:
        """Whether effective filter ``f`` is acknowledged under identifier ``sid``."""
        e = self.effective.get(f)
        return e is not None and e.id == sid and e.acked

    # -- changes ---------------------------------------------------------------------------
    def assign(self, name: str, filters: Iterable[str]) -> Change:
        """Subscription ``name`` now needs exactly ``filters`` (new filters are placed
        before old ones are released, so nothing it keeps is ever uncovered)."""
        wanted = frozenset(filters)
        before = self.by_name.get(name, frozenset())
        change = Change()
        for f in wanted - before:
            change.merge(self._request(f))
        if wanted:
            self.by_name[name] = wanted
        else:
            self.by_name.pop(name, None)
        for f in before - wanted:
            change.merge(self._release(f))
        return change.cancel()

    def release(self, name: str) -> Change:
        """Subscription ``name`` is gone."""
        return self.assign(name, ())

    def acked(self, f: str, sid: int) -> bool:
        """The broker acknowledged ``f`` under ``sid``; False when that is no longer an
        effective filter (it was replaced meanwhile)."""
        e = self.effective.get(f)
        if e is None or e.id != sid:
            return False
        e.acked = True
        self.known[f] = sid
        return True

    def unsubscribed(self, f: str, sid: int) -> None:
        """The broker removed ``f`` (identifier ``sid``)."""
        if self.known.get(f) == sid:
            del self.known[f]

    def reset_acks(self) -> None:
        """The broker lost the session: nothing is subscribed there any more."""
        self.known.clear()
        for e in self.effective.values():
            e.acked = False

    # -- internals -------------------------------------------------------------------------
    def _id_for(self, f: str) -> int:
        known = self.known.get(f)
        if known is not None:
            return known
        sid = self._next_id
        self._next_id = sid + 1 if sid < MAX_SUBSCRIPTION_ID else 1
        return sid

    def _request(self, f: str) -> Change:
        count = self.requested.get(f, 0)
        self.requested[f] = count + 1
        if count:
            return Change()
        return self._place(f)

    def _release(self, f: str) -> Change:
        count = self.requested.get(f, 0) - 1
        if count > 0:
            self.requested[f] = count
            return Change()
        self.requested.pop(f, None)
        return self._unplace(f)

    def _drop(self, f: str) -> _Effective:
        e = self.effective.pop(f)
        self._trie.remove(f)
        # retired: the broker will forget it, and a comeback needs a new identifier
        self.known.pop(f, None)
        return e

    def _install(self, e: _Effective) -> None:
        self.effective[e.filter] = e
        self._trie.add(e.filter)
        for m in e.members:
            self.owner[m] = e.filter

    def _place(self, f: str) -> Change:
        """Serve requested filter ``f``: by a covering effective filter, or by a new one
        that absorbs the effective filters it overlaps."""
        for e in self._trie.overlapping(f):
            if covers(e, f):
                self.effective[e].members.add(f)
                self.owner[f] = e
                return Change()
        new = f
        absorbed: list[_Effective] = []
        while True:
            found = self._trie.overlapping(new)
            if not found:
                break
            for e in found:
                if not covers(new, e):
                    new = join(new, e)
                absorbed.append(self._drop(e))
        members = {f}.union(*(a.members for a in absorbed))
        same = next((a for a in absorbed if a.filter == new), None)
        if same is not None:  # the join is a filter the broker has already
            same.members = members
            self.known[new] = same.id
            self._install(same)
            return Change(retire=[(a.filter, a.id) for a in absorbed if a is not same])
        created = _Effective(new, self._id_for(new), members)
        self._install(created)
        return Change(subscribe=[(new, created.id)], retire=[(a.filter, a.id) for a in absorbed])

    def _unplace(self, f: str) -> Change:
        """Stop serving requested filter ``f``; an effective filter nobody needs goes, and
        one that is wider than what is left is replaced by what its members need."""
        name = self.owner.pop(f)
        e = self.effective[name]
        e.members.discard(f)
        if not e.members:
            self._drop(name)
            return Change(retire=[(e.filter, e.id)])
        if name in self.requested:
            return Change()  # still wanted as it is
        self._drop(name)
        change = Change()
        for m in sorted(e.members):
            change.merge(self._place(m))
        back = self.effective.get(name)
        if back is not None:
            # the members still need the same filter: keep it as it was at the broker
            change.subscribe = [s for s in change.subscribe if s[0] != name]
            back.id, back.acked = e.id, e.acked
            self.known[name] = e.id
            return change
        change.retire.append((e.filter, e.id))
        return change
