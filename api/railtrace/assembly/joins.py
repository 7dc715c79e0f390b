"""Which traces may join a request, and which KV-transfer spans count for it.

Any holder of the ingest token can send spans that carry another request's ids, so a shared
request key alone does not make a trace part of a request (docs/reliability.md, "Threat
model"). The rules, applied to the traces (units) that share a key:

- A unit whose parent links already tie the EPP's `gateway.request` to a downstream hop
  (sidecar or engine) is a whole request: it is never merged into another such unit.
- Key joins only close the propagation gaps of real releases: an EPP-only unit (<= v0.8),
  a sidecar unit, orphan vLLM `llm_request` units (<= v0.9) and KV-transfer units fill the
  hops the request lacks. A unit that brings a hop the request already has (a second EPP
  root, a second decode engine) is a contradicting candidate: reported, not merged.
- A joining unit and every KV span must come from the identity the request expects (the
  sender address `railtrace.otlp.peer`, `k8s.pod.ip`, `k8s.pod.name`; a claimed `k8s.*` only
  where a trusted collector vouches for it, `railtrace.otlp.claims`): an orphan decode engine
  from the decode pod (the sidecar's pod), a prefill engine from the prefill target's address,
  an EPP unit whose prefill address is the sidecar's, a KV span from the decode engine (the
  prefill engine for a `write`, i.e. push). A contradiction rejects it; where neither side
  carries an identity it joins as `unverified`, and an unverified KV span never counts when a
  verified one exists. A KV unit that fits several requests sharing its id joins the one where
  it is verified: an unverified request (a forger's own, with the victim's ids) cannot take it.
- A unit with no request hop at all (unknown spans that merely carry the id) joins nothing.
- The one exception to the first rule is llm-d's coordinator (docs/normalisation.md §10): it
  sends each phase back through the gateway, untraced, so an untraced client's request
  arrives as two whole units sharing only `x-request-id` -- a prefill phase (its own EPP
  root tied to a prefill engine only) and a decode phase (its own EPP root tied to a decode
  engine only). Such a pair is merged only when a KV span the runner of the transfer sent
  names the other phase's engine as its peer (`_link`), or, where an engine carries no
  identity, unverified; each phase must be the other's only such partner, so a third phase
  of either kind stays out (in `coverage.rejected`).

Pure functions of the spans, like the rest of assembly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from railtrace.model import Span
from railtrace.normalize import engine_leg_hint
from railtrace_tracing import semconv
from railtrace_tracing.semconv import ROLE

REQUEST_ROLES = frozenset(
    {ROLE.GATEWAY, ROLE.SCHEDULING, ROLE.PROXY, ROLE.PREFILL, ROLE.DECODE, ROLE.KV_TRANSFER}
)
EPP_SLOT, SIDECAR_SLOT = "epp", "sidecar"
VERIFIED, UNKNOWN, CONTRADICTED = 0, 1, 2
MAX_NOTES = 16  # notes per kind kept on one request; the rest are counted


@dataclass(slots=True)
class JoinNotes:
    """What admission decided beyond the plain join, for the request's evidence."""

    rejected: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    dropped: int = 0  # notes beyond MAX_NOTES

    def reject(self, note: str) -> None:
        if len(self.rejected) < MAX_NOTES:
            self.rejected.append(note)
        else:
            self.dropped += 1

    def unverify(self, note: str) -> None:
        if len(self.unverified) < MAX_NOTES:
            self.unverified.append(note)
        else:
            self.dropped += 1

    def merge(self, other: JoinNotes) -> None:
        for note in other.rejected:
            self.reject(note)
        for note in other.unverified:
            self.unverify(note)
        self.dropped += other.dropped


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a span, as far as the service believes: the pod name and the addresses.
    `unbelieved`: what the resource claimed beyond that, for the evidence only."""

    pod: str | None
    ips: frozenset[str]
    unbelieved: str = ""

    def __bool__(self) -> bool:
        return bool(self.pod or self.ips)

    def describe(self) -> str:
        parts = [f"pod {self.pod}"] if self.pod else []
        parts += sorted(self.ips)
        text = ", ".join(parts) or "no identity"
        return f"{text} ({self.unbelieved})" if self.unbelieved else text


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def identity(span: Span) -> Identity:
    """The sender's identity (docs/normalisation.md, "Identity"). Where ingest recorded who
    vouches for the resource's `k8s.*` (`railtrace.otlp.claims`): a trusted collector's claims
    are the identity and its own address is not (every pod behind it shares that address); a
    sender's own claims count only where they agree with its address, which alone is then the
    identity -- a pod name cannot be checked here (no topology), so it is not believed. Without
    the key (spans not received by the service's receivers) the resource is read as it is."""
    resource = span.resource if isinstance(span.resource, dict) else {}
    pod = _text(resource.get(semconv.RES_POD))
    pod_ip = _text(resource.get(semconv.RES_POD_IP))
    peer = _text(resource.get(semconv.RES_OTLP_PEER))
    claims = resource.get(semconv.RES_OTLP_CLAIMS)
    if claims == semconv.CLAIMS_COLLECTOR:
        return Identity(pod, frozenset({pod_ip} if pod_ip else ()))
    if claims == semconv.CLAIMS_SENDER:
        unbelieved = [f"claims pod {pod}"] if pod else []
        if pod_ip and pod_ip != peer:
            unbelieved.append(f"claims k8s.pod.ip {pod_ip}")
        note = ", ".join(unbelieved) + (" without a trusted collector" if unbelieved else "")
        return Identity(None, frozenset({peer} if peer else ()), note)
    return Identity(pod, frozenset(ip for ip in (pod_ip, peer) if ip))


def agree(a: Identity, b: Identity) -> bool | None:
    """Same sender? Pod names decide when both have one, else addresses; None: cannot tell."""
    if a.pod and b.pod:
        return a.pod == b.pod
    if a.ips and b.ips:
        return bool(a.ips & b.ips)
    return None


def _host(address: object) -> str | None:
    if not isinstance(address, str) or not address or "/" in address:
        return None
    host = address.strip()
    if host.startswith("["):
        return host[1:].split("]", 1)[0] or None
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _fold(results: Iterable[bool | None]) -> int:
    """Verdict of several comparisons: any contradiction rejects, else any agreement verifies."""
    found = list(results)
    if False in found:
        return CONTRADICTED
    return VERIFIED if True in found else UNKNOWN


def _ref(span: Span) -> str:
    return f"{span.canonical_name}@{span.span_id}"


def _engine_leg(span: Span, index: dict[str, Span]) -> str | None:
    seen = {span.span_id}
    current = index.get(span.parent_span_id or "")
    while current is not None and current.span_id not in seen:
        if current.canonical_name in (ROLE.PREFILL, ROLE.DECODE) and current.role in (
            ROLE.PREFILL,
            ROLE.DECODE,
        ):
            return current.role
        seen.add(current.span_id)
        current = index.get(current.parent_span_id or "")
    leg, _ = engine_leg_hint(span)
    return leg


class Unit:
    """One trace (or one request of a trace holding several) and the hops it brings."""

    def __init__(self, uid: str, spans: Sequence[Span]) -> None:
        self.uid = uid
        self.spans = list(spans)
        self.trace_id = self.spans[0].trace_id if self.spans else uid
        self.start_ns = min((s.start_ns for s in self.spans), default=0)
        index = {s.span_id: s for s in self.spans}
        self.epp = [s for s in self.spans if s.role in (ROLE.GATEWAY, ROLE.SCHEDULING)]
        self.gateway = any(s.role == ROLE.GATEWAY for s in self.spans)
        self.sidecar = [
            s
            for s in self.spans
            if s.role == ROLE.PROXY
            or (s.canonical_name in (ROLE.PREFILL, ROLE.DECODE) and s.role in (ROLE.PREFILL, ROLE.DECODE))
        ]
        self.engines: dict[str, Span] = {}
        self.unlabelled: list[Span] = []  # legs assembly decides later (shorter one is prefill)
        for s in self.spans:
            if s.canonical_name == semconv.SPAN_VLLM_REQUEST:
                leg = _engine_leg(s, index)
                if leg is None:
                    self.unlabelled.append(s)
                else:
                    self.engines.setdefault(leg, s)
        self.kv = [s for s in self.spans if s.role == ROLE.KV_TRANSFER]
        self.request = any(s.role in REQUEST_ROLES for s in self.spans)
        self.whole = self.gateway and bool(self.sidecar or self.engines or self.unlabelled)
        slots = []
        if self.epp:
            slots.append(EPP_SLOT)
        if self.sidecar:
            slots.append(SIDECAR_SLOT)
        slots += sorted(self.engines)
        self.slots = tuple(slots)
        self.fills = bool(slots or self.unlabelled)

    # What the unit says about identities and addresses, worked out once when first asked
    # (each distinct value once: a unit may hold thousands of spans of one sender).
    @cached_property
    def sidecar_ids(self) -> frozenset[Identity]:
        return frozenset(i for i in map(identity, self.sidecar) if i)

    @cached_property
    def prefill_targets(self) -> frozenset[str]:
        hosts = (_host(s.attributes.get(semconv.PD_PREFILL_TARGET)) for s in self.sidecar)
        return frozenset(h.lower() for h in hosts if h)

    @cached_property
    def epp_prefill(self) -> frozenset[str]:
        hosts = (_host(s.attributes.get(semconv.EPP_PD_PREFILL_ADDRESS)) for s in self.epp)
        return frozenset(h.lower() for h in hosts if h)

    def describe(self) -> str:
        root = min(self.spans, key=lambda s: (s.parent_span_id is not None, s.start_ns, s.span_id))
        return f"trace {self.trace_id} (root {_ref(root)})"


class _Merged:
    """The request being built: its units and what they say about each leg's identity."""

    def __init__(self, core: Unit) -> None:
        self.units = [core]
        self.slots = set(core.slots)
        self.unlabelled = len(core.unlabelled)
        self._legs: dict[str, list[Identity]] = {}

    def add(self, unit: Unit) -> None:
        self.units.append(unit)
        self.slots.update(unit.slots)
        self.unlabelled += len(unit.unlabelled)
        self._legs.clear()

    def room(self, unit: Unit) -> bool:
        """No hop the unit brings is here already, and its unlabelled engines have a leg free."""
        if self.slots & set(unit.slots):
            return False
        legs = {ROLE.PREFILL, ROLE.DECODE} - self.slots - set(unit.slots)
        return len(unit.unlabelled) + self.unlabelled <= len(legs)

    def engine(self, leg: str) -> Span | None:
        return next((u.engines[leg] for u in self.units if leg in u.engines), None)

    def sidecar_ids(self) -> set[Identity]:
        return {i for u in self.units for i in u.sidecar_ids}

    def prefill_hosts(self) -> set[str]:
        """Hosts the sidecar sends the prefill leg to."""
        return {h for u in self.units for h in u.prefill_targets}

    def epp_prefill_hosts(self) -> set[str]:
        """The prefill pod address the EPP chose."""
        return {h for u in self.units for h in u.epp_prefill}

    def leg_identities(self, leg: str) -> list[Identity]:
        """What the request already says about the pod that ran this leg."""
        known = self._legs.get(leg)
        if known is None:
            known = self._legs[leg] = self._leg_identities(leg)
        return known

    def _leg_identities(self, leg: str) -> list[Identity]:
        found: list[Identity] = []
        engine = self.engine(leg)
        if engine is not None and identity(engine):
            found.append(identity(engine))
        if leg == ROLE.DECODE:  # the sidecar runs in the decode pod
            found += sorted(self.sidecar_ids() - set(found), key=Identity.describe)
        return found


def _check(unit: Unit, merged: _Merged) -> tuple[int, str]:
    """Whether a joining unit comes from where the request expects, and on what evidence."""
    results: list[bool | None] = []
    basis: list[str] = []
    if unit.epp:
        mine, theirs = set(unit.epp_prefill), merged.prefill_hosts()
        if mine and theirs:
            results.append(bool(mine & theirs))
            basis.append(f"prefill address {sorted(mine)} vs the sidecar's {sorted(theirs)}")
    if unit.sidecar and not unit.epp:
        theirs = merged.epp_prefill_hosts()
        mine = set(unit.prefill_targets)
        if mine and theirs:
            results.append(bool(mine & theirs))
            basis.append(f"prefill target {sorted(mine)} vs the EPP's {sorted(theirs)}")
    for engine in unit.unlabelled:  # either leg: it must agree with one of them
        mine_id = identity(engine)
        per_leg = [
            _fold(agree(mine_id, ref) for ref in merged.leg_identities(leg))
            for leg in (ROLE.PREFILL, ROLE.DECODE)
        ]
        results.append(True if VERIFIED in per_leg else None if UNKNOWN in per_leg else False)
        basis.append(f"unlabelled engine {mine_id.describe()}")
    for leg, engine in unit.engines.items():
        mine_id = identity(engine)
        for ref in merged.leg_identities(leg):
            results.append(agree(mine_id, ref))
            basis.append(f"{leg} engine {mine_id.describe()} vs {ref.describe()}")
        if leg == ROLE.PREFILL and mine_id.ips:
            hosts = merged.prefill_hosts() | merged.epp_prefill_hosts()
            if hosts:
                results.append(bool({ip.lower() for ip in mine_id.ips} & hosts))
                basis.append(f"prefill engine {mine_id.describe()} vs prefill target {sorted(hosts)}")
    return _fold(results), "; ".join(basis)


def _kv_leg(span: Span) -> str:
    """The engine that runs a transfer: the decode engine pulls (`read`), the prefill engine
    pushes (`write`)."""
    op = span.attributes.get(semconv.KV_OPERATION)
    return ROLE.PREFILL if isinstance(op, str) and op.lower() == "write" else ROLE.DECODE


def kv_status(span: Span, merged: _Merged) -> int:
    """VERIFIED, UNKNOWN or CONTRADICTED: whether a KV span's sender is the engine that ran it."""
    mine = identity(span)
    return _fold(agree(mine, ref) for ref in merged.leg_identities(_kv_leg(span)))


def kv_basis(span: Span, merged: _Merged) -> str:
    """The evidence `kv_status` weighed, for the request's notes."""
    leg = _kv_leg(span)
    known = ", ".join(r.describe() for r in merged.leg_identities(leg)) or "unknown"
    return (
        f"{_ref(span)} in trace {span.trace_id} from {identity(span).describe()}, the {leg} engine is {known}"
    )


def _rank(unit: Unit) -> tuple[int, int, int, str]:
    """Which unit of a key group is the request's core when none is whole: the sidecar's, then
    an engine's, then the EPP's; more hops first; then by start and id (for a stable answer)."""
    kind = 0 if unit.sidecar else 1 if unit.engines else 2 if unit.epp else 3
    return (kind, -len(unit.slots), unit.start_ns, unit.uid)


def admit(units: dict[str, list[Span]]) -> list[tuple[list[Span], JoinNotes]]:
    """Split one group of units that share request keys into requests, with their notes."""
    infos = [Unit(uid, spans) for uid, spans in sorted(units.items()) if spans]
    inert = [u for u in infos if not u.request]
    live = [u for u in infos if u.request]
    out: list[tuple[list[Span], JoinNotes]] = [(u.spans, JoinNotes()) for u in inert]
    if not live:
        return out
    wholes = [u for u in live if u.whole]
    pairs: list[tuple[Unit, Unit, int, str]] = []
    early: dict[str, JoinNotes] = {}
    if wholes:
        cores, fragments = wholes, [u for u in live if not u.whole]
        pairs, early = _coordinator_pairs(wholes, [s for u in live for s in u.kv])
        joined_phases = {id(p) for p, _d, _s, _b in pairs}
        cores = [u for u in cores if id(u) not in joined_phases]
    else:
        # The best-ranked unit is the core. Another of its kind that brings the same hop (two
        # decode engines of one id, two sidecar traces) is a request of its own, not a member:
        # start time and ids are the sender's word, so neither may displace the other.
        ordered = sorted(live, key=_rank)
        kind = _rank(ordered[0])[0]
        cores, fragments = ordered[:1], []
        for unit in ordered[1:]:
            same = _rank(unit)[0] == kind and bool(set(unit.slots) & set(ordered[0].slots))
            (cores if same else fragments).append(unit)
    merged = [_Merged(c) for c in cores]
    notes = [early.get(c.uid) or JoinNotes() for c in cores]
    # A coordinator's prefill phase joins its decode phase's request (checked in `_link`).
    where = {c.uid: i for i, c in enumerate(cores)}
    for prefill, decode, status, basis in pairs:
        i = where[decode.uid]
        merged[i].add(prefill)
        notes[i].merge(early.get(prefill.uid) or JoinNotes())
        if status == UNKNOWN:
            notes[i].unverify(f"{prefill.describe()} joined as the coordinator's prefill phase; {basis}")
    fragments.sort(key=lambda u: (u.start_ns, u.uid))

    # Slot-filling fragments: each goes to the one request it fits (no hop it brings is there
    # already, its identity not contradicted). Two fragments that bring the same hop with the
    # same standing are contradicting candidates: neither joins.
    placed: list[tuple[Unit, int, int, str]] = []  # unit, request index, status, basis
    for unit in (u for u in fragments if u.fills):
        fits: list[tuple[int, int, str]] = []  # (status, request index, basis)
        for i, m in enumerate(merged):
            if not m.room(unit):
                continue
            status, basis = _check(unit, m)
            if status != CONTRADICTED:
                fits.append((status, i, basis))
        best = [f for f in fits if f[0] == min((f[0] for f in fits), default=UNKNOWN)]
        if len(best) != 1:
            why = "it brings a hop the request already has or its sender contradicts the request"
            if len(best) > 1:
                why = f"it fits {len(best)} requests that share its id"
            for n in notes:
                n.reject(f"{unit.describe()} not joined: {why}")
            continue
        status, i, basis = best[0]
        placed.append((unit, i, status, basis))
    by_slot: dict[tuple[int, str], list[tuple[Unit, int]]] = {}
    for unit, i, status, _ in placed:
        for slot in unit.slots:
            by_slot.setdefault((i, slot), []).append((unit, status))
    refused: set[str] = set()
    for (i, slot), held in by_slot.items():
        top = min(status for _, status in held)
        leaders = [u for u, status in held if status == top]
        for unit, status in held:
            if status != top:
                refused.add(unit.uid)
                notes[i].reject(f"{unit.describe()} not joined: a verified {slot} hop was joined instead")
            elif len(leaders) > 1:
                refused.add(unit.uid)
                notes[i].reject(
                    f"{unit.describe()} not joined: {len(leaders)} traces bring the {slot} hop, "
                    "none verified over the others"
                )
    # Identity of joined hops is judged against the core (not against each other).
    for unit, i, status, _basis in placed:
        if unit.uid in refused:
            continue
        merged[i].add(unit)
        if status == UNKNOWN:
            notes[i].unverify(f"{unit.describe()} joined by request id; sender not verified")

    # KV-transfer spans, wherever they came (their own trace, or inside another).
    # A unit verified for one request joins it even where another (unverified: a forger's own
    # request with the same ids) would also take it: a verified hop is not dropped for that.
    kv_units = [u for u in fragments if not u.fills]
    for unit in kv_units:
        standing = [_check_kv_unit(unit, m) for m in merged]
        top = min(standing, default=CONTRADICTED)
        kv_fits = [i for i, s in enumerate(standing) if s == top != CONTRADICTED]
        if len(kv_fits) == 1:
            chosen = kv_fits[0]
            merged[chosen].add(unit)
            for i, status in enumerate(standing):
                if i == chosen:
                    continue
                if status == CONTRADICTED:
                    basis = "; ".join(kv_basis(s, merged[i]) for s in unit.kv[:1])
                    why = f"its sender is not the engine: {basis}"
                else:
                    why = "it is verified for another request that shares its id"
                notes[i].reject(f"{unit.describe()} not joined: {why}")
        else:
            why = f"it fits {len(kv_fits)} requests that share its id"
            if not kv_fits:
                why = "its sender is not the engine: " + "; ".join(
                    kv_basis(s, m) for m in merged for s in unit.kv[:1]
                )
            for n in notes:
                n.reject(f"{unit.describe()} not joined: {why}")
    for m, n in zip(merged, notes, strict=True):
        drop = _kv_filter(m, n)
        spans = [s for u in m.units for s in u.spans if id(s) not in drop]
        out.append((spans, n))
    return out


# -- The coordinator's phases (llm-d-router cmd/coordinator; docs/normalisation.md §10) -------
# The scheduling profile a phase ran: the EPP's `run_scheduler_profile` names it (the header
# profile handler runs the profile `EPP-Profile` names, headerprofile/header_profile_handler.go
# @ ebab687927f5 l.41), and a gateway that records request headers shows the header itself.
# No `llm_d.coordinator.*` attribute exists at that commit: none is read.
PHASE_PROFILE_ATTRIBUTES = (semconv.EPP_PROFILE_NAME, semconv.HTTP_EPP_PROFILE_HEADER)


def _profiles(unit: Unit) -> set[str]:
    """The phases the unit's EPP spans name (`prefill`, `decode`), lower case."""
    found: set[str] = set()
    for span in unit.epp:
        for key in PHASE_PROFILE_ATTRIBUTES:
            raw = span.attributes.get(key)
            for value in raw if isinstance(raw, list) else (raw,):
                if isinstance(value, str) and value.strip().lower() in (ROLE.PREFILL, ROLE.DECODE):
                    found.add(value.strip().lower())
    return found


def _phase(unit: Unit) -> tuple[str, Span] | None:
    """(leg, engine span) when the unit is one coordinator phase: a whole unit of one EPP root
    tied to one engine, with no sidecar (the coordinator replaces it, llm-d-router
    docs/coordinator_architecture.md @ ebab687927f5 l.419; coordinator-epd/patch-decode.yaml
    removes it) and no EPP profile naming the other leg. An engine whose leg its own span does
    not tell takes the leg the EPP's profile names."""
    if not unit.whole or unit.sidecar or len(unit.engines) + len(unit.unlabelled) != 1:
        return None
    if sum(1 for s in unit.epp if s.role == ROLE.GATEWAY) != 1:
        return None
    named = _profiles(unit)
    if unit.engines:
        ((leg, engine),) = unit.engines.items()
    elif len(named) == 1:
        leg, engine = next(iter(named)), unit.unlabelled[0]
    else:
        return None
    return (leg, engine) if named <= {leg} else None


def _link(prefill: Span, decode: Span, kv: Sequence[Span]) -> tuple[int, str]:
    """Whether a prefill phase's and a decode phase's engines are one request's two legs: a KV
    span sent by the engine that ran the transfer (decode for a pull, prefill for a push) that
    names the other engine as its peer (`llm_d.kv_transfer.remote.host`) verifies the pair,
    one naming another peer contradicts it. Without such a span the pair is unverified, which
    counts only where an engine carries no identity (docs/reliability.md §11)."""
    ids = {ROLE.PREFILL: identity(prefill), ROLE.DECODE: identity(decode)}
    results: list[bool | None] = []
    basis: list[str] = []
    for span in kv:
        leg = _kv_leg(span)
        peer_leg = ROLE.DECODE if leg == ROLE.PREFILL else ROLE.PREFILL
        if agree(identity(span), ids[leg]) is not True:
            continue  # not this engine's transfer: the KV rules judge it
        remote = _host(span.attributes.get(semconv.KV_REMOTE_HOST))
        if remote is None:
            continue
        results.append(agree(Identity(None, frozenset({remote.lower()})), ids[peer_leg]))
        basis.append(
            f"{_ref(span)} from the {leg} engine names peer {remote}, the {peer_leg} engine is "
            f"{ids[peer_leg].describe()}"
        )
    status = _fold(results)
    if status == UNKNOWN:
        basis.append("no KV span of the engine that ran the transfer names the other phase's engine")
        if ids[ROLE.PREFILL] and ids[ROLE.DECODE]:
            status = CONTRADICTED  # both legs have an identity: only a KV span may link them
    return status, "; ".join(basis)


def _coordinator_pairs(
    wholes: Sequence[Unit], kv: Sequence[Span]
) -> tuple[list[tuple[Unit, Unit, int, str]], dict[str, JoinNotes]]:
    """The coordinator's phase pairs among whole units that share a request id: (prefill
    unit, decode unit, VERIFIED or UNKNOWN, basis), and notes for the phases left out. A pair
    is made only where each is the other's one best partner (a second phase of the same
    standing leaves both out); a pair not linked (`_link`) is not made."""
    phases: dict[str, list[tuple[Unit, Span]]] = {ROLE.PREFILL: [], ROLE.DECODE: []}
    for unit in wholes:
        found = _phase(unit)
        if found is not None:
            phases[found[0]].append((unit, found[1]))
    notes: dict[str, JoinNotes] = {}
    if not phases[ROLE.PREFILL] or not phases[ROLE.DECODE]:
        return [], notes
    links = {
        (p.uid, d.uid): _link(pe, de, kv) for p, pe in phases[ROLE.PREFILL] for d, de in phases[ROLE.DECODE]
    }

    def best(uid: str, own: int) -> tuple[str, int, int] | None:
        """The one partner of best standing, with that standing and how many share it."""
        fits = [
            (key[1 - own], st) for key, (st, _) in links.items() if key[own] == uid and st != CONTRADICTED
        ]
        top = min((st for _, st in fits), default=CONTRADICTED)
        leaders = [k for k, st in fits if st == top]
        return (leaders[0], top, 1) if len(leaders) == 1 else (("", top, len(leaders)) if leaders else None)

    pairs: list[tuple[Unit, Unit, int, str]] = []
    units = {u.uid: u for u, _ in phases[ROLE.PREFILL] + phases[ROLE.DECODE]}
    paired: set[str] = set()
    for p, _pe in phases[ROLE.PREFILL]:
        mine = best(p.uid, 0)
        if mine is None or mine[2] != 1:
            continue
        theirs = best(mine[0], 1)
        if theirs is not None and theirs[2] == 1 and theirs[0] == p.uid:
            status, basis = links[(p.uid, mine[0])]
            pairs.append((p, units[mine[0]], status, basis))
            paired |= {p.uid, mine[0]}
    for uid, unit in units.items():
        if uid in paired:
            continue
        leg = ROLE.PREFILL if any(u is unit for u, _ in phases[ROLE.PREFILL]) else ROLE.DECODE
        own = 0 if leg == ROLE.PREFILL else 1
        tried = [(key[1 - own], links[key]) for key in links if key[own] == uid]
        contradicted = [f"{units[o].describe()}: {b}" for o, (st, b) in tried if st == CONTRADICTED]
        rivals = best(uid, own)
        if rivals is not None and rivals[2] > 1:
            why = f"{rivals[2]} phases of the other leg are linked to it with the same standing"
        elif rivals is not None:
            why = "another " + leg + " phase is linked to its partner as well or better"
        else:
            why = "no phase of the other leg is linked to it (" + "; ".join(contradicted[:2]) + ")"
        note = f"{unit.describe()} not joined as the coordinator's {leg} phase: {why}"
        for other in paired:
            notes.setdefault(other, JoinNotes()).reject(note)
        notes.setdefault(uid, JoinNotes()).reject(note)
    return pairs, notes


def _check_kv_unit(unit: Unit, merged: _Merged) -> int:
    """The worst standing of the unit's KV spans."""
    return max((kv_status(s, merged) for s in unit.kv), default=UNKNOWN)


def _kv_filter(merged: _Merged, notes: JoinNotes) -> set[int]:
    """KV spans that do not count (by `id()`): from a sender that is not the engine, or
    unverified while a verified one exists. Noted in the evidence."""
    judged = [(s, kv_status(s, merged)) for u in merged.units for s in u.kv]
    verified = any(status == VERIFIED for _, status in judged)
    drop: set[int] = set()
    for span, status in judged:
        if status == CONTRADICTED:
            drop.add(id(span))
            notes.reject(f"KV span not counted, its sender is not the engine: {kv_basis(span, merged)}")
        elif status == UNKNOWN and verified:
            drop.add(id(span))
            notes.reject(f"KV span not counted, unverified beside a verified one: {kv_basis(span, merged)}")
        elif status == UNKNOWN and span.trace_id != _core_trace(merged):
            notes.unverify(f"KV span counted, sender not verified: {kv_basis(span, merged)}")
    return drop


def _core_trace(merged: _Merged) -> str:
    return merged.units[0].trace_id


def filter_single(spans: list[Span]) -> tuple[list[Span], JoinNotes]:
    """The KV rule for a request that came in one trace."""
    if not any(s.role == ROLE.KV_TRANSFER for s in spans):
        return spans, JoinNotes()
    merged = _Merged(Unit("", spans))
    notes = JoinNotes()
    drop = _kv_filter(merged, notes)
    return ([s for s in spans if id(s) not in drop] if drop else spans), notes


__all__ = ["Identity", "JoinNotes", "admit", "agree", "filter_single", "identity"]
