"""ElasticApp: the console. Views of one job at a time, the command bar, and steering with confirmation."""

from __future__ import annotations

import time
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import ContentSwitcher, Footer, Input

from elasticd.client import ClientError
from tui.actions import ACTIONS_BY_ID, STEERING_KEYS, ActionSpec, bindings
from tui.commands import ActionsProvider
from tui.feeds import poll_job
from tui.messages import ModelChanged, PlanReady, SteerDone
from tui.model import Clock, JobModel
from tui.paging import is_placeholder
from tui.screens.confirm import ConfirmScreen
from tui.screens.help import HelpScreen
from tui.screens.node_detail import NodeDetailScreen
from tui.screens.rank_output import RankOutputScreen
from tui.screens.stacks import StacksScreen
from tui.session import Connector, JobSession, live_link
from tui.steering import NoTarget, SteerRequest, build_requests, execute, preview
from tui.views import VIEW_NAMES, CheckpointsView, EventsView, GoodputView, LossView, NodesView, RanksView
from tui.views.table import SyncedTable
from tui.widgets.header import JobHeader, header_text

REDRAW_MIN_INTERVAL_S = 0.1  # at most 10 frames a second: a redraw costs only the rows on screen that changed


class ElasticApp(App[None]):
    """Follows one or more jobs; `:` switches views, `/` filters, `?` lists every key."""

    CSS_PATH = "app.tcss"
    TITLE = "elastic-tui"
    BINDINGS: ClassVar[list[BindingType]] = bindings()
    COMMANDS = App.COMMANDS | {ActionsProvider}

    def __init__(self, jobs: dict[str, list[str]], readonly: bool = False, connect: Connector = live_link,
                 clock: Clock = time.time, seed_pubs: dict[str, str] | None = None,
                 poll_interval_s: float = 1.0) -> None:
        super().__init__()
        self.readonly, self.poll_interval_s = readonly, poll_interval_s
        self.sessions = {job_id: JobSession(job_id, seeds, connect, clock, seed_pubs)
                         for job_id, seeds in jobs.items()}
        self.current = next(iter(self.sessions), "")
        self.view, self.pattern, self.bar_mode = "nodes", "", ""
        self.marks: set[str] = set()
        self.announced: set[str] = set()
        self.last_redraw, self.redraw_pending = 0.0, False
        self.redraw_timer: Timer | None = None

    # ---- layout -------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield JobHeader(id="header")
        with ContentSwitcher(initial="nodes", id="views"):
            yield NodesView()
            yield RanksView(id="ranks")
            yield EventsView(id="events")
            yield CheckpointsView()
            yield LossView()
            yield GoodputView()
        yield Input(id="bar", placeholder=":nodes :ranks :events :ckpt :loss :goodput :job ID :q")
        yield Footer()

    def on_mount(self) -> None:
        for session in self.sessions.values():
            self.follow_job(session)
        self.bar.display = False
        self.set_interval(1.0, self.redraw)
        self.redraw()
        self.nodes_table.focus()

    @property
    def model(self) -> JobModel:
        return self.sessions[self.current].model

    @property
    def session(self) -> JobSession:
        return self.sessions[self.current]

    @property
    def nodes_table(self) -> NodesView:
        return self.main.query_one(NodesView)

    @property
    def bar(self) -> Input:
        return self.main.query_one("#bar", Input)

    # ---- I/O workers (never touch widgets) ---------------------------------------------------------
    @work(group="feeds", exit_on_error=False)
    async def follow_job(self, session: JobSession) -> None:
        await poll_job(session, lambda: self.announce(session.job_id), self.poll_interval_s)

    def announce(self, job_id: str) -> None:
        """Post one ModelChanged per job until it is handled: a burst of telemetry costs one message."""
        if job_id not in self.announced:
            self.announced.add(job_id)
            self.post_message(ModelChanged(job_id))

    @work(group="steer", exit_on_error=False)
    async def dry_run(self, action_id: str, requests: list[SteerRequest], force: bool) -> None:
        try:
            effect = await preview(self.session, requests, force)
        except ClientError as err:
            if err.code == "refused" and not force:
                self.post_message(PlanReady(action_id, requests, "", refused=err.reason))
            else:
                self.post_message(SteerDone(action_id, f"{requests[0].label}: [{err.code}] {err.reason}", False))
            return
        self.post_message(PlanReady(action_id, requests, effect, force=force))

    @work(group="steer", exit_on_error=False)
    async def send_steer(self, action_id: str, requests: list[SteerRequest], force: bool) -> None:
        try:
            self.post_message(SteerDone(action_id, await execute(self.session, requests, force), True))
        except ClientError as err:
            self.post_message(SteerDone(action_id, f"{requests[0].label}: [{err.code}] {err.reason}", False))

    # ---- drawing ------------------------------------------------------------------------------------
    def on_model_changed(self, message: ModelChanged) -> None:
        self.announced.discard(message.job_id)
        if message.job_id != self.current or self.redraw_pending:
            return
        wait = self.last_redraw + REDRAW_MIN_INTERVAL_S - time.monotonic()
        if wait <= 0:
            self.redraw()
        else:
            self.redraw_pending = True
            self.redraw_timer = self.set_timer(wait, self.redraw)

    @property
    def main(self) -> Screen[None]:
        return self.screen_stack[0]

    def redraw(self) -> None:
        self.redraw_pending, self.last_redraw = False, time.monotonic()
        if self.redraw_timer is not None:  # drawn now (the 1 s tick, a key): the pending one would draw twice
            self.redraw_timer.stop()
            self.redraw_timer = None
        if not self.screen_stack:
            return
        try:
            self.draw_main()
            if isinstance(self.screen, NodeDetailScreen):
                self.screen.redraw()
        except NoMatches:
            return  # not composed yet: the main screen at start, a node detail just pushed

    def draw_main(self) -> None:
        header = self.main.query_one(JobHeader)
        header.show(header_text(self.model, self.readonly, list(self.sessions), self.view, header.size.width))
        view = self.main.query_one(f"#{self.view}")
        view.show(self.model, self.marks, self.pattern)  # type: ignore[attr-defined]

    def switch_view(self, name: str) -> None:
        self.view, self.pattern = name, ""
        self.query_one(ContentSwitcher).current = name
        self.redraw()
        focus = self.query_one(f"#{name}")
        tables = [focus] if isinstance(focus, SyncedTable) else list(focus.query(SyncedTable))
        if tables:
            tables[-1].focus()

    # ---- actions ------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "run" and parameters and self.readonly:
            spec = ACTIONS_BY_ID.get(str(parameters[0]))
            if spec is not None and spec.steers:
                return None  # shown greyed out in the footer
        return True

    def on_key(self, event: object) -> None:
        key = getattr(event, "key", "")
        if self.readonly and key in STEERING_KEYS and not self.bar.has_focus:
            self.notify(f"read-only: {STEERING_KEYS[key].description} is disabled", severity="warning")

    def action_run(self, action_id: str) -> None:
        spec = ACTIONS_BY_ID[action_id]
        if spec.steers:
            self.begin_steer(spec)
            return
        handler = getattr(self, f"do_{action_id}", None)
        if action_id.startswith("view_"):
            self.switch_view(action_id.removeprefix("view_"))
        elif handler is not None:
            handler()

    def do_command_bar(self) -> None:
        self.open_bar(":")

    def do_filter(self) -> None:
        self.open_bar("/")

    def do_help(self) -> None:
        self.push_screen(HelpScreen(self.readonly))

    def do_quit(self) -> None:
        self.exit()

    def do_back(self) -> None:
        if self.bar.display:
            self.close_bar()
        self.pattern, self.marks = "", set()
        self.redraw()

    def do_log_scale(self) -> None:
        plot = self.main.query_one(LossView)
        plot.log_scale = not plot.log_scale
        if self.view != "loss":
            self.switch_view("loss")  # the key says what it is for: show the plot it changed
        else:
            self.redraw()

    def do_mark(self) -> None:
        node_id = self.cursor_node()
        if node_id is not None:
            self.marks ^= {node_id}
            self.redraw()

    def do_next_job(self) -> None:
        jobs = list(self.sessions)
        self.current = jobs[(jobs.index(self.current) + 1) % len(jobs)]
        self.marks = set()
        self.redraw()

    def do_output(self) -> None:
        if isinstance(self.screen, RankOutputScreen):
            return  # followed already
        target = self.looked_at()
        if target is None or target[1] is None:
            self.notify("output: put the cursor on a node that runs workers, or on a rank in its detail",
                        severity="warning")
            return
        self.push_screen(RankOutputScreen(self.session, target[0], target[1]))

    def do_stacks(self) -> None:
        target = self.looked_at()
        if target is None:
            self.notify("stacks: put the cursor on a node first", severity="warning")
            return
        rank = target[1] if isinstance(self.screen, RankOutputScreen) else None  # elsewhere: every rank of the node
        self.push_screen(StacksScreen(self.session, target[0], rank))

    def looked_at(self) -> tuple[str, int | None] | None:
        """The node and rank on screen: a rank's output; node detail's node and the rank under its cursor; the
        nodes view's cursor node and its first rank (the one kill_worker targets)."""
        screen = self.screen
        if isinstance(screen, RankOutputScreen):
            return screen.node_id, screen.rank
        if isinstance(screen, NodeDetailScreen):
            return screen.node_id, screen.cursor_rank()
        node = self.model.nodes.get(self.cursor_node() or "") if screen is self.main else None
        if node is None:
            return None
        return node.node_id, node.ranks[0] if node.ranks else None

    def cursor_node(self) -> str | None:
        key = self.nodes_table.cursor_key() if self.view == "nodes" else None
        return None if key is None or is_placeholder(key) else key

    def targets(self) -> list[str]:
        if self.marks:
            return sorted(self.marks)
        node_id = self.cursor_node()
        return [node_id] if node_id else []

    def begin_steer(self, spec: ActionSpec) -> None:
        if self.readonly:
            self.notify(f"read-only: {spec.description} is disabled", severity="warning")
            return
        nodes = self.targets()
        ranks = self.model.nodes[nodes[0]].ranks if nodes and nodes[0] in self.model.nodes else []
        try:
            requests = build_requests(spec, self.model, nodes, ranks[0] if ranks else None)
        except NoTarget as err:
            self.notify(str(err), severity="warning")
            return
        self.dry_run(spec.id, requests, False)

    def on_plan_ready(self, message: PlanReady) -> None:
        spec = ACTIONS_BY_ID[message.action_id]
        what = ", ".join(r.label for r in message.requests)
        title = f"{'FORCE ' if message.force else ''}{what} (job {self.current})?"

        def answered(answer: str | None) -> None:
            if answer == "confirm":
                self.send_steer(message.action_id, message.requests, message.force)
            elif answer == "force":
                self.dry_run(message.action_id, message.requests, True)
            else:
                self.notify(f"{what}: cancelled")

        self.push_screen(ConfirmScreen(title, message.effect, message.refused,
                                       spec.destructive or message.force), answered)

    def on_steer_done(self, message: SteerDone) -> None:
        self.notify(message.text, severity="information" if message.ok else "error", timeout=8)

    # ---- command bar and filter -------------------------------------------------------------------------
    def open_bar(self, mode: str) -> None:
        self.bar_mode = mode
        self.bar.display = True
        self.bar.value = "" if mode == ":" else self.pattern
        self.bar.placeholder = (":nodes :ranks :events :ckpt :loss :goodput :job ID :q" if mode == ":"
                                else "/regex filter (!regex inverts; on :loss, 'job' = job-wide)")
        self.bar.focus()

    def close_bar(self) -> None:
        self.bar.display = False
        self.bar_mode = ""
        self.switch_focus_back()

    def switch_focus_back(self) -> None:
        view = self.query_one(f"#{self.view}")
        tables = [view] if isinstance(view, SyncedTable) else list(view.query(SyncedTable))
        if tables:
            tables[-1].focus()

    @on(Input.Changed, "#bar")
    def bar_changed(self, event: Input.Changed) -> None:
        if self.bar_mode == "/":
            self.pattern = event.value
            self.redraw()

    @on(Input.Submitted, "#bar")
    def bar_submitted(self, event: Input.Submitted) -> None:
        mode, text = self.bar_mode, event.value.strip().lstrip(":")
        self.close_bar()
        if mode == ":":
            self.run_command(text)

    def run_command(self, text: str) -> None:
        word, _, rest = text.partition(" ")
        if word in VIEW_NAMES:
            self.switch_view(VIEW_NAMES[word])
        elif word in ("q", "quit"):
            self.exit()
        elif word == "job" and rest.strip() in self.sessions:
            self.current, self.marks = rest.strip(), set()
            self.redraw()
        elif word:
            self.notify(f"unknown command :{text}; try :nodes :ranks :events :ckpt :loss :goodput :job ID",
                        severity="warning")

    @on(SyncedTable.RowSelected, "#nodes")
    def open_node(self, event: SyncedTable.RowSelected) -> None:
        if not is_placeholder(event.key):
            self.push_screen(NodeDetailScreen(self.session, event.key))

    def on_nodes_view_rows_shown(self, message: NodesView.RowsShown) -> None:
        self.session.show_rows(message.first, message.count)

