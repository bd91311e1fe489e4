//! The status page: `/status` (HTML, drawn on the server, no scripts, no external assets) and
//! `/status.json` on the health-check listener, for people without Grafana. It is better than a
//! dashboard at one thing: explaining a verdict — for each open incident and recent call, which
//! spans it rests on, which layer decided, what was missing, the authority needed and the next
//! action.
//!
//! Fed by [`StatusSink`](crate::emit::status::StatusSink) from the engine's records; queue fills
//! are read when the page is drawn. The page is a maud template: every interpolated value is
//! HTML-escaped by construction (server, tool and agent names come from software nobody vetted),
//! and only the page's own stylesheet is written unescaped.
//!
//! An operator's tool, so without scripts: filters by server, agent and state are a query string
//! (links and a plain form), the page reloads itself every [`REFRESH_SECONDS`] unless the query
//! says `refresh=0`, and every trace id links to the trace backend when
//! `extensions.health_check.status.trace_url` is set.

use std::sync::Arc;

use axum::http::{header, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};

use crate::emit::sink::Sink;
use crate::emit::status::{CallView, IncidentView, QueueFill, SharedStatus, SpanView, StatusSink, StatusSnapshot, StatusView};
use crate::evidence::time::Moment;
use crate::flow::queue::Queue;

/// Reads one queue's depth and capacity; `None` once the queue is closed.
type Probe = Box<dyn Fn() -> Option<(usize, usize)> + Send + Sync>;

/// The status page's state: the snapshot and the queues it reports.
#[derive(Clone, Default)]
pub(crate) struct Status {
    snapshot: SharedStatus,
    queues: Arc<std::sync::Mutex<Vec<(&'static str, Probe)>>>,
}

impl Status {
    /// A page reporting the exporter queues that exist (own output, pass-through).
    pub(crate) fn new<T: Send + 'static>(exporters: [Option<&Queue<T>>; 2]) -> Status {
        let s = Status { snapshot: StatusSnapshot::shared(), queues: Arc::default() };
        for q in exporters.into_iter().flatten() {
            s.watch_queue(q);
        }
        s
    }

    /// Report a queue's fill, under its name. Through its gauge: the page never keeps a queue open.
    pub(crate) fn watch_queue<T: Send + 'static>(&self, q: &Queue<T>) {
        let gauge = q.gauge();
        let name = gauge.name();
        let probe: Probe = Box::new(move || gauge.depth().map(|d| (d, gauge.capacity())));
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).push((name, probe));
    }

    /// The sink that keeps the page's snapshot.
    pub(crate) fn sink(&self) -> impl Sink + 'static {
        StatusSink(self.snapshot.clone())
    }

    /// What the page shows now.
    pub(crate) fn view(&self) -> StatusView {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(name, probe)| probe().map(|(depth, capacity)| QueueFill { name, depth, capacity }))
            .collect();
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner()).view(Moment::wall_now(), queues)
    }

    /// `/status` and `/status.json`, to merge into the health-check router; `trace_url` is
    /// `extensions.health_check.status.trace_url` (validated by the configuration).
    pub(crate) fn routes(&self, trace_url: Option<&str>) -> Router {
        let (a, b) = (self.clone(), self.clone());
        let links = Links { trace_url: trace_url.map(Arc::from) };
        Router::new()
            .route(
                "/status",
                get(move |uri: Uri| {
                    let (s, links) = (a.clone(), links.clone());
                    async move {
                        let filter = Filter::parse(uri.query());
                        let html = render_html(&s.view(), &filter, &links);
                        ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], html).into_response()
                    }
                }),
            )
            .route(
                "/status.json",
                get(move |uri: Uri| {
                    let s = b.clone();
                    async move {
                        let filter = Filter::parse(uri.query());
                        ([(header::CACHE_CONTROL, "no-store")], axum::Json(filter.apply(s.view()))).into_response()
                    }
                }),
            )
    }
}

/// How often the page reloads itself (meta refresh) unless the query says `refresh=0`.
pub(crate) const REFRESH_SECONDS: u32 = 10;

/// Longest filter value taken from a query string (longer ones are ignored: no server, agent or
/// state name is that long).
const MAX_FILTER_LEN: usize = 256;

/// Where the page links out to.
#[derive(Clone, Debug, Default)]
pub(crate) struct Links {
    /// A trace backend's URL with `{trace_id}`.
    pub trace_url: Option<Arc<str>>,
}

impl Links {
    fn trace(&self, trace_id: &str) -> Option<String> {
        self.trace_url.as_deref().map(|u| u.replace("{trace_id}", trace_id))
    }
}

/// What the reader asked to see, from the query string: `server`, `agent`, `state` (a health
/// state, or an incident's `open`/`waiting`) and `refresh=0` to stop the reloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Filter {
    pub server: Option<String>,
    pub agent: Option<String>,
    pub state: Option<String>,
    pub refresh: bool,
}

impl Default for Filter {
    fn default() -> Self {
        Filter { server: None, agent: None, state: None, refresh: true }
    }
}

impl Filter {
    /// Read a query string. Unknown keys, empty values and values past [`MAX_FILTER_LEN`] are
    /// ignored; nothing in it can fail the page.
    pub(crate) fn parse(query: Option<&str>) -> Filter {
        let mut f = Filter::default();
        for pair in query.unwrap_or("").split('&').take(16) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if v.is_empty() || v.len() > MAX_FILTER_LEN * 3 {
                continue;
            }
            let v = percent_decode(v);
            if v.len() > MAX_FILTER_LEN {
                continue;
            }
            match k {
                "server" => f.server = Some(v),
                "agent" => f.agent = Some(v),
                "state" => f.state = Some(v),
                "refresh" => f.refresh = !matches!(v.as_str(), "0" | "off" | "false" | "no"),
                _ => {}
            }
        }
        f
    }

    fn any(&self) -> bool {
        self.server.is_some() || self.agent.is_some() || self.state.is_some()
    }

    /// The query string of this filter with `change` applied (a link to another view).
    fn href(&self, change: impl FnOnce(&mut Filter)) -> String {
        let mut f = self.clone();
        change(&mut f);
        let mut parts = Vec::new();
        for (k, v) in [("server", &f.server), ("agent", &f.agent), ("state", &f.state)] {
            if let Some(v) = v {
                parts.push(format!("{k}={}", percent_encode(v)));
            }
        }
        if !f.refresh {
            parts.push("refresh=0".into());
        }
        if parts.is_empty() {
            "/status".into()
        } else {
            format!("/status?{}", parts.join("&"))
        }
    }

    fn call(&self, c: &CallView) -> bool {
        self.server.as_deref().is_none_or(|s| c.server.as_deref() == Some(s))
            && self.agent.as_deref().is_none_or(|a| c.agent.as_deref() == Some(a))
            && self.state.as_deref().is_none_or(|s| c.state == s)
    }

    fn incident(&self, i: &IncidentView) -> bool {
        self.server.as_deref().is_none_or(|s| i.server.as_deref() == Some(s))
            && self.agent.as_deref().is_none_or(|a| i.agents.iter().any(|x| x == a))
            && self.state.as_deref().is_none_or(|s| i.state == s || i.incident_state == s)
    }

    /// The view with only what the filter admits (the rates by server only: they are per server).
    pub(crate) fn apply(&self, mut v: StatusView) -> StatusView {
        if !self.any() {
            return v;
        }
        v.incidents.retain(|i| self.incident(i));
        v.resolved_incidents.retain(|i| self.incident(i));
        v.recent_calls.retain(|c| self.call(c));
        if let Some(s) = &self.server {
            v.servers.retain(|r| &r.server == s);
            v.catalogs.retain(|c| c.server.as_ref() == Some(s));
            v.drift.retain(|d| &d.server == s);
        }
        if let Some(a) = &self.agent {
            v.catalogs.retain(|c| c.agent.as_ref() == Some(a));
        }
        v
    }
}

/// `%XX` and `+` decoded; invalid sequences kept as they are, invalid UTF-8 replaced.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(x) => {
                    out.push(x);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Everything but the unreserved characters as `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b':' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The values the filters offer: every server, agent and state on the unfiltered page.
struct Choices {
    servers: Vec<String>,
    agents: Vec<String>,
    states: Vec<&'static str>,
}

impl Choices {
    fn of(v: &StatusView) -> Choices {
        let mut servers: Vec<String> = v.servers.iter().map(|s| s.server.clone()).collect();
        servers.extend(v.incidents.iter().chain(&v.resolved_incidents).filter_map(|i| i.server.clone()));
        servers.extend(v.recent_calls.iter().filter_map(|c| c.server.clone()));
        let mut agents: Vec<String> = v.incidents.iter().chain(&v.resolved_incidents).flat_map(|i| i.agents.iter().cloned()).collect();
        agents.extend(v.recent_calls.iter().filter_map(|c| c.agent.clone()));
        agents.extend(v.catalogs.iter().filter_map(|c| c.agent.clone()));
        let mut states: Vec<&'static str> = v.incidents.iter().chain(&v.resolved_incidents).map(|i| i.state).collect();
        states.extend(v.recent_calls.iter().map(|c| c.state));
        for l in [&mut servers, &mut agents] {
            l.sort();
            l.dedup();
        }
        states.sort_unstable();
        states.dedup();
        Choices { servers, agents, states }
    }
}

/// The first `n` bytes of an identifier (a hash, a digest), or all of it when that is no boundary.
fn short(s: &str, n: usize) -> &str {
    s.get(..n).unwrap_or(s)
}

fn pct(r: Option<f64>) -> String {
    r.map_or_else(|| "—".to_string(), |r| format!("{:.1} %", r * 100.0))
}

/// How long before `now` an evidence time was, in words.
fn ago(now_ns: u64, t_ns: u64) -> String {
    if t_ns == 0 {
        return "—".into();
    }
    let s = now_ns.saturating_sub(t_ns) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn utc(ns: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)).to_string()
}

/// A duration in the unit that reads best.
fn duration(ns: u64) -> String {
    match ns {
        0..=999_999 => format!("{} µs", ns / 1000),
        1_000_000..=9_999_999_999 => format!("{} ms", ns / 1_000_000),
        _ => format!("{:.1} s", ns as f64 / 1e9),
    }
}

fn state_class(state: &str) -> &'static str {
    match state {
        "healthy" => "ok",
        "unverified" | "working" | "waiting" => "warn",
        _ => "bad",
    }
}

const STYLE: &str = "body{font:13px/1.35 system-ui,sans-serif;margin:.8em 1.2em;color:#1d2330;background:#fafbfc}\
h1{font-size:1.3em;margin:0;display:inline-block;margin-right:.6em}h2{font-size:1.05em;margin:.6em 0 .2em}p{margin:.2em 0}\
header p{display:inline;margin:0}\
table{border-collapse:collapse;width:100%;background:#fff}th,td{border:1px solid #d0d7de;padding:.15em .4em;text-align:left;vertical-align:top}\
th{background:#f0f3f6;font-weight:600;white-space:nowrap}td,th{overflow-wrap:normal;word-break:normal;hyphens:none}\
code,.id{font:12px ui-monospace,monospace;white-space:nowrap}.muted{color:#57606a}\
.bad{color:#b42318;font-weight:600}.ok{color:#1a7f37;font-weight:600}.warn{color:#9a6700;font-weight:600}\
.nowrap{white-space:nowrap}form.filters{margin:.4em 0;display:flex;gap:.6em;align-items:center;flex-wrap:wrap}\
form.filters select{max-width:18em}.summary{margin:.3em 0}\
details{margin:0}details>summary{cursor:pointer;color:#0969da}details[open]{padding:.3em .4em;background:#f6f8fa;border-left:3px solid #8c959f}\
table.spans{margin:.3em 0;width:auto}table.spans td,table.spans th{padding:.05em .35em}\
.layers span{display:inline-block;margin-right:.3em;padding:0 .3em;border-radius:3px}\
.l-passed{background:#dafbe1}.l-failed{background:#ffd8d3}.l-unobserved{background:#eaeef2}\
.grid{display:grid;grid-template-columns:1.4fr 1fr 1fr;gap:0 1em}\
.bar{display:inline-block;width:80px;height:.8em;background:#eaeef2;vertical-align:middle}.bar i{display:block;height:100%;background:#0969da}";

/// The page: the view as filtered, with choices from the whole view.
pub(crate) fn render_html(v: &StatusView, f: &Filter, links: &Links) -> String {
    let choices = Choices::of(v);
    let total = (v.incidents.len(), v.recent_calls.len());
    let v = f.apply(v.clone());
    let now = v.generated_at_ns;
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "mcp-health status" }
                meta name="viewport" content="width=device-width";
                @if f.refresh {
                    meta http-equiv="refresh" content=(REFRESH_SECONDS);
                }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { "mcp-health status" }
                    p.muted {
                        "Drawn at " span.nowrap { (utc(now)) " UTC" } ". "
                        @if f.refresh {
                            "Reloads every " (REFRESH_SECONDS) " s (" a.refresh-off href=(f.href(|f| f.refresh = false)) { "stop" } "). "
                        } @else {
                            "Auto-refresh off (" a.refresh-on href=(f.href(|f| f.refresh = true)) { "turn on" } "). "
                        }
                        "Machine-readable: " a href="/status.json" { "/status.json" } "."
                    }
                }
                (filters(f, &choices))
                (summary(&v, f, total))
                (incidents(&v, f, links))
                (resolved(&v, f, links))
                div.grid {
                    section { (rates(&v, f)) }
                    section { (queues(&v)) }
                    section { (catalogs(&v)) (drift(&v)) }
                }
                (recent(&v, f, links))
                @let evicted: Vec<String> = v.evicted.iter().filter(|(_, n)| *n > 0).map(|(t, n)| format!("{t} {n}")).collect();
                @if !evicted.is_empty() {
                    p.muted { "Pushed out of this page's bounded tables so far: " (evicted.join(", ")) "." }
                }
            }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}

/// The filter form: plain GET, no script.
fn filters(f: &Filter, c: &Choices) -> Markup {
    html! {
        form.filters method="get" action="/status" {
            b { "Filter" }
            label { "server " select name="server" {
                option value="" { "(any)" }
                @for s in &c.servers { option value=(s) selected[f.server.as_ref() == Some(s)] { (s) } }
            } }
            label { "agent " select name="agent" {
                option value="" { "(any)" }
                @for a in &c.agents { option value=(a) selected[f.agent.as_ref() == Some(a)] { (a) } }
            } }
            label { "state " select name="state" {
                option value="" { "(any)" }
                @for s in &c.states { option value=(s) selected[f.state.as_deref() == Some(*s)] { (s) } }
            } }
            @if !f.refresh { input type="hidden" name="refresh" value="0"; }
            button type="submit" { "Show" }
            @if f.any() {
                a.clear href=(f.href(|f| { f.server = None; f.agent = None; f.state = None; })) { "clear filters" }
            }
        }
    }
}

/// One line: how many incidents, servers, sessions off their catalog, and the fullest queue.
fn summary(v: &StatusView, f: &Filter, (incidents, calls): (usize, usize)) -> Markup {
    let off = v.catalogs.iter().filter(|c| c.convergence != "converged").count();
    let fullest = v.queues.iter().max_by(|a, b| {
        let f = |q: &QueueFill| if q.capacity == 0 { 0.0 } else { q.depth as f64 / q.capacity as f64 };
        f(a).total_cmp(&f(b))
    });
    html! {
        p.summary {
            b class=(if v.incidents.is_empty() { "ok" } else { "bad" }) { (v.incidents.len()) " open incident(s)" }
            " · " (v.resolved_incidents.len()) " resolved lately · " (v.servers.len()) " server(s) · "
            (off) " of " (v.catalogs.len()) " session catalog(s) not converged · " (v.drift.len()) " drift report(s)"
            @if let Some(q) = fullest { " · fullest queue: " (q.name) " " (q.depth) " / " (q.capacity) }
            @if f.any() {
                span.filtered { " · filtered: " (v.incidents.len()) " of " (incidents) " open incident(s), " (v.recent_calls.len()) " of " (calls) " recent call(s)" }
            }
        }
    }
}

/// A trace id, whole (ids differ anywhere, often only at the end) and never wrapped, linked to
/// the trace backend when one is configured.
fn trace(links: &Links, trace_id: &str) -> Markup {
    html! {
        @match links.trace(trace_id) {
            Some(url) => a.trace.id href=(url) { (trace_id) },
            None => code.trace { (trace_id) },
        }
    }
}

fn server_link(f: &Filter, server: Option<&str>) -> Markup {
    html! {
        @match server {
            Some(s) => a.server href=(f.href(|f| f.server = Some(s.to_string()))) { (s) },
            None => "—",
        }
    }
}

fn incidents(v: &StatusView, f: &Filter, links: &Links) -> Markup {
    html! {
        h2 #incidents { "Open incidents (" (v.incidents.len()) ")" }
        @if v.incidents.is_empty() {
            p.ok { "No open incidents." }
        } @else {
            table.incidents {
                tr { th { "Server" } th { "First failed layer" } th { "Owner" } th { "State / error / authority needed" } th { "Tool" }
                     th { "Next action" } th { "Impact" } th { "Last evidence" } }
                @for i in &v.incidents {
                    tr.incident {
                        td { (server_link(f, i.server.as_deref())) }
                        td.bad.layer { (i.first_failed_layer.unwrap_or("none")) }
                        td.owner title=(i.owner.as_str()) { (i.owner.describe()) }
                        td {
                            span class=(state_class(i.state)) { (i.state) }
                            @if let Some(e) = &i.error_class { " " code { (e) } }
                            @if let Some(m) = i.error_meaning { " " span.meaning { "(" (m) ")" } }
                            @if let Some(a) = &i.required_authority { " " span.authority { "needs " code { (a) } } }
                            @if i.incident_state == "waiting" { " " span.warn { "(waiting: authorization flow pending)" } }
                        }
                        td { @match (&i.tool, i.state) {
                            (Some(t), _) => code { (t) },
                            (None, "needs_auth") => "(every tool of the credential)",
                            (None, _) => "—",
                        } }
                        td.next-action { (i.next_action) }
                        td { (i.calls) " call(s), " (i.sessions) " session(s), agents: "
                            @if i.agents.is_empty() { "—" }
                            @for (n, a) in i.agents.iter().enumerate() { @if n > 0 { ", " } (a) } }
                        td.nowrap title=(utc(i.last_evidence_ns)) { (ago(v.generated_at_ns, i.last_evidence_ns)) }
                    }
                    tr.evidence { td colspan="8" {
                        @match &i.evidence {
                            Some(c) => (chain(c, links, "Evidence chain of the latest failing call")),
                            None => span.muted { "No call of this incident was decided by this instance since it started." },
                        }
                    } }
                }
            }
        }
    }
}

fn resolved(v: &StatusView, f: &Filter, links: &Links) -> Markup {
    html! {
        h2 #resolved { "Resolved lately (" (v.resolved_incidents.len()) ")" }
        @if v.resolved_incidents.is_empty() {
            p.muted { "None." }
        } @else {
            table.resolved {
                tr { th { "State" } th { "Layer" } th { "Error" } th { "Owner" } th { "Server" } th { "Tool" } th { "Resolved by" } }
                @for i in &v.resolved_incidents {
                    tr.resolved-incident {
                        td class=(state_class(i.state)) { (i.state) }
                        td { (i.first_failed_layer.unwrap_or("none")) }
                        td { @match &i.error_class { Some(e) => code { (e) }, None => "—" } }
                        td.owner { (i.owner.describe()) }
                        td { (server_link(f, i.server.as_deref())) }
                        td { @match &i.tool { Some(t) => code { (t) }, None => "—" } }
                        td.resolved-by.nowrap {
                            @match &i.resolved_by {
                                Some(r) if r.by == "healthy_call" => {
                                    "healthy " (r.method.as_deref().unwrap_or("call")) " "
                                    @if let Some(t) = &r.tool { code { (t) } " " }
                                    @if let Some(t) = &r.trace_id { (trace(links, t)) " " }
                                    span.muted title=(utc(r.at_ns)) { (ago(v.generated_at_ns, r.at_ns)) }
                                }
                                Some(r) => {
                                    "catalog re-listed (" (r.agent.as_deref().unwrap_or("session")) ") "
                                    span.muted title=(utc(r.at_ns)) { (ago(v.generated_at_ns, r.at_ns)) }
                                }
                                None => span.muted { "not seen by this instance" },
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A call's evidence chain, folded: its spans, the layers, the layer and clock that decided and
/// what was missing.
fn chain(c: &CallView, links: &Links, title: &str) -> Markup {
    html! {
        details.chain {
            summary {
                (title) ", " (c.spans.len() + usize::from(c.more_spans)) " span(s): "
                b.decided { (c.decided_layer) }
                @if let Some(m) = c.reason_meaning { " — " span.meaning { (m) } }
            }
            div {
                (c.method.as_deref().unwrap_or("—")) " "
                @if let Some(t) = &c.tool { code { (t) } " " }
                "on " (c.server.as_deref().unwrap_or("—")) ", trace " (trace(links, &c.trace_id))
                ", span " code { (c.span_id) }
                @if let Some(s) = &c.session_id_hash { ", session hash " code { (short(s, 16)) } }
                ", " (duration(c.duration_ns)) "."
            }
            @if c.spans.is_empty() {
                div.muted { "No span recorded (restored from the state store)." }
            } @else {
                (spans(&c.spans))
            }
            @if c.more_spans > 0 { div.muted { "…and " (c.more_spans) " more span(s), counted only." } }
            div.layers { "Layers: " @for (l, s) in &c.layers { span class=(format!("l-{s}")) { (l) " " (s) } } }
            div {
                "State " b { (c.state) } ", confidence " (c.confidence)
                @if let Some(o) = c.owner { ", owner " b.owner { (o.describe()) } }
                @if c.revision > 0 { ", revision " (c.revision) }
                ". Decided by " code.clock { (c.decided_by) } ": " (c.decided_by_meaning) "."
            }
            div.missing {
                "Missing: "
                @if c.missing.is_empty() { "nothing." }
                @for (n, m) in c.missing.iter().enumerate() { @if n > 0 { "; " } (m) }
                @if !c.missing.is_empty() { "." }
            }
            div { "Next action: " (c.next_action) }
        }
    }
}

fn spans(spans: &[SpanView]) -> Markup {
    html! {
        table.spans {
            tr { th { "Side" } th { "Instrumentation" } th { "Name" } th { "Status" } th { "HTTP" } th { "Error" } th { "Duration" } th { "Decided" } }
            @for s in spans {
                tr.span {
                    td.side { (s.side) }
                    td { (s.instrumentation) }
                    td { code { (s.name) } }
                    td class=(if s.status == "error" { "bad" } else { "" }) { (s.status) }
                    td.http { @match s.http_status { Some(h) => (h), None => "—" } }
                    td.error {
                        @match (s.error_code, s.error) {
                            (Some(code), Some(m)) => { code { (code) } " " (m) }
                            (None, Some(m)) => (m),
                            _ => "—",
                        }
                        @if let Some(t) = s.transport { @if s.error.is_none() { "transport " (t) } }
                        @if let Some(o) = s.outcome { "outcome " (o) }
                    }
                    td.nowrap { (duration(s.duration_ns)) }
                    td.span-layer { (s.finding) }
                }
            }
        }
    }
}

fn rates(v: &StatusView, f: &Filter) -> Markup {
    html! {
        h2 #rates { "Success rates per server (" (v.servers.len()) ")" }
        @if v.servers.is_empty() {
            p.muted { "No attempts yet." }
        } @else {
            table.rates {
                tr { th { "Server" } th { "Attempts" } th title="passed transport, protocol and authorization" { "Protocol success" }
                     th title="the intended outcome was observed (healthy)" { "Verified success" }
                     th title="attempts no span shows answered or failed; not counted as successes" { "Unconfirmed" } }
                @for s in &v.servers {
                    tr {
                        td { (server_link(f, Some(&s.server))) }
                        td { (s.rates.attempts) }
                        td.protocol-rate.nowrap { (pct(s.protocol_success_rate)) " " span.muted { "(" (s.rates.protocol_successes) ")" } }
                        td.verified-rate.nowrap { (pct(s.verified_success_rate)) " " span.muted { "(" (s.rates.verified_successes) ")" } }
                        td.unconfirmed { (s.rates.unconfirmed) }
                    }
                }
            }
        }
    }
}

fn catalogs(v: &StatusView) -> Markup {
    html! {
        h2 #catalogs { "Catalog state per session (" (v.catalogs.len()) ")" }
        @if v.catalogs.is_empty() {
            p.muted { "None yet: no tools/list was seen." }
        } @else {
            table.catalogs {
                tr { th { "Session" } th { "Client" } th { "Server" } th { "State" } th { "Next step" } }
                @for c in &v.catalogs {
                    tr {
                        td { code { (short(&c.session_hash, 12)) } }
                        td { (c.agent.as_deref().unwrap_or("—")) }
                        td { (c.server.as_deref().unwrap_or("—")) }
                        td class=(if c.convergence == "converged" { "ok" } else { "bad" }) title=(c.reason) { (c.convergence) }
                        td { (c.next_step) " " span.muted { "(" (c.protocol_revision) ")" } }
                    }
                }
            }
        }
    }
}

fn drift(v: &StatusView) -> Markup {
    html! {
        h2 #drift { "Contract drift (" (v.drift.len()) ")" }
        @if v.drift.is_empty() {
            p.muted { "None (or no lockfile configured)." }
        } @else {
            table.drift {
                tr { th { "Server" } th { "Tool" } th { "What changed" } th { "Pinned → seen" } }
                @for d in &v.drift {
                    tr {
                        td { (d.server) }
                        td { (d.tool) }
                        td { @if d.changes.is_empty() { "—" } @for (n, c) in d.changes.iter().enumerate() { @if n > 0 { br; } (c) } }
                        td { code { (short(&d.pinned_digest, 19)) } " → " code { (short(&d.digest, 19)) } }
                    }
                }
            }
        }
    }
}

fn queues(v: &StatusView) -> Markup {
    html! {
        h2 #queues { "Queues" }
        table.queues {
            tr { th { "Queue" } th { "Depth / capacity" } th { "Fill" } }
            @for q in &v.queues {
                @let fill = if q.capacity == 0 { 0.0 } else { q.depth as f64 / q.capacity as f64 * 100.0 };
                tr {
                    td { (q.name) }
                    td { (q.depth) " / " (q.capacity) }
                    td.nowrap { span.bar { i style=(format!("width:{fill:.0}%")) {} } " " (format!("{fill:.0} %")) }
                }
            }
        }
    }
}

fn recent(v: &StatusView, f: &Filter, links: &Links) -> Markup {
    html! {
        h2 #recent { "Recent calls (" (v.recent_calls.len()) ")" }
        @if v.recent_calls.is_empty() {
            p.muted { "No call decided yet." }
        } @else {
            table.recent {
                tr { th { "When" } th { "Server" } th { "Agent" } th { "Tool" } th { "State" } th { "Trace" } th { "Explanation" } }
                @for c in &v.recent_calls {
                    tr.call {
                        td.nowrap title=(utc(c.end_ns)) { (ago(v.generated_at_ns, c.end_ns)) }
                        td { (server_link(f, c.server.as_deref())) }
                        td { @match &c.agent { Some(a) => a href=(f.href(|f| f.agent = Some(a.clone()))) { (a) }, None => "—" } }
                        td.nowrap {
                            // `tools/call` goes without saying; other methods are named.
                            @if c.method.as_deref() != Some("tools/call") { (c.method.as_deref().unwrap_or("—")) " " }
                            @if let Some(t) = &c.tool { code { (t) } }
                        }
                        td class=(state_class(c.state)) { (c.state) }
                        td { (trace(links, &c.trace_id)) }
                        td { (chain(c, links, "evidence")) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::status::StatusSnapshot;
    use crate::engine::Decided;
    use crate::verdict::{sample, Verdict};

    fn links() -> Links {
        Links { trace_url: Some(Arc::from("https://jaeger.example/trace/{trace_id}")) }
    }

    #[test]
    fn status_page_escapes_hostile_names() {
        let mut s = StatusSnapshot::default();
        let v = Verdict {
            server: Some(Arc::from("<script>alert(1)</script>")),
            tool: Some(Arc::from("\"><img src=x onerror=alert(2)>")),
            agent: Some(Arc::from("<svg onload=alert(3)>")),
            ..sample("tools/call", true, false)
        };
        s.accept(&[Decided::Call(Arc::new(v))]);
        let view = s.view(Moment::from_nanos(1_000_000_000), vec![]);
        // Filters echo what the reader typed: markup there is text too.
        let f = Filter::parse(Some("server=%3Cscript%3Ealert(4)%3C%2Fscript%3E&agent=%22%3E%3Cb%3E"));
        for (n, html) in [render_html(&view, &Filter::default(), &links()), render_html(&view, &f, &links())].into_iter().enumerate() {
            assert!(!html.contains("<script>") && !html.contains("<img") && !html.contains("<svg"), "{html}");
            if n == 1 {
                assert!(
                    html.contains("%3Cscript%3Ealert%284%29") && html.contains("agent=%22%3E%3Cb%3E"),
                    "the filter is kept in links, encoded: {html}"
                );
                continue;
            }
            assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
            assert!(html.contains("&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"), "{html}");
            assert!(html.contains("&lt;svg onload=alert(3)&gt;"), "{html}");
        }
    }

    #[test]
    fn status_filters_come_from_the_query_string() {
        let table: [(Option<&str>, Filter); 6] = [
            (None, Filter::default()),
            (Some(""), Filter::default()),
            (
                Some("server=tickets.example%3A8443&state=needs_auth"),
                Filter { server: Some("tickets.example:8443".into()), state: Some("needs_auth".into()), ..Filter::default() },
            ),
            (
                Some("agent=support+bot&refresh=0&other=1"),
                Filter { agent: Some("support bot".into()), refresh: false, ..Filter::default() },
            ),
            (Some("server=&refresh=1&%zz"), Filter::default()),
            (Some(&*format!("server={}", "a".repeat(MAX_FILTER_LEN + 1))), Filter::default()),
        ];
        for (q, want) in table {
            assert_eq!(Filter::parse(q), want, "{q:?}");
        }
        assert_eq!(percent_decode("%E2%9C%93%2"), "✓%2");
        let f = Filter { server: Some("a b&c".into()), refresh: false, ..Filter::default() };
        assert_eq!(f.href(|_| {}), "/status?server=a%20b%26c&refresh=0");
        assert_eq!(Filter::parse(Some(&f.href(|_| {})[8..])), f, "a link reads back as its filter");
    }

    #[test]
    fn status_page_filters_links_traces_and_names_owners() {
        let mut s = StatusSnapshot::default();
        let failing = |server: &str, agent: &str| Verdict {
            server: Some(Arc::from(server)),
            agent: Some(Arc::from(agent)),
            state: crate::verdict::HealthState::ProtocolError,
            first_failed_layer: Some(crate::verdict::Layer::Protocol),
            reason: Some("jsonrpc_-32601".into()),
            trace_id: [0xab; 16],
            ..sample("tools/call", false, false)
        };
        s.accept(&[Decided::Call(Arc::new(failing("alpha:1", "bot-a"))), Decided::Call(Arc::new(failing("beta:2", "bot-b")))]);
        let view = s.view(Moment::from_nanos(1_000_000_000), vec![]);
        let all = render_html(&view, &Filter::default(), &links());
        assert!(all.contains("http-equiv=\"refresh\""), "refreshes by default");
        assert!(all.contains(&format!("href=\"https://jaeger.example/trace/{}\"", "ab".repeat(16))), "{all}");
        assert!(all.contains("client implementer"), "the owner of a protocol failure");
        assert!(all.contains("method not found"), "the code in words");
        assert!(all.contains("alpha:1") && all.contains("beta:2"));
        let only = render_html(&view, &Filter::parse(Some("server=alpha%3A1&refresh=0")), &Links::default());
        assert!(!only.contains("http-equiv=\"refresh\""), "refresh=0 stops the reloads");
        assert!(!only.contains("jaeger.example"), "no trace link without trace_url");
        let rows = only.matches("<tr class=\"call\">").count();
        assert_eq!(rows, 1, "one server's calls: {only}");
        assert!(only.contains("filtered: "));
        let agent = Filter::parse(Some("agent=bot-b")).apply(view.clone());
        assert_eq!(agent.recent_calls.iter().map(|c| c.agent.as_deref()).collect::<Vec<_>>(), vec![Some("bot-b")]);
        let state = Filter::parse(Some("state=healthy")).apply(view);
        assert!(state.recent_calls.is_empty());
    }

    #[tokio::test]
    async fn status_queues_report_depth_and_capacity_and_never_hold_a_queue_open() {
        use crate::flow::queue::{bounded, OnFull};
        let (tx, mut rx) = bounded::<u8>("otlp", 4, OnFull::Refuse);
        let st = Status::new::<u8>([Some(&tx), None]);
        tx.reserve().unwrap().send(1);
        tx.reserve().unwrap().send(2);
        assert_eq!(st.view().queues, vec![QueueFill { name: "otlp", depth: 2, capacity: 4 }]);
        drop(tx);
        rx.recv().await;
        rx.recv().await;
        assert_eq!(rx.recv().await, None, "the page's probe does not keep the queue open");
        assert!(st.view().queues.is_empty());
    }
}
