//! Catalog evidence (SPEC section 4): change signals, `tools/list` pages, installs. Three events
//! that must never be collapsed — the signal, the discovery, the install — each with its own time.

use std::sync::Arc;

/// Where a list-change signal came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalSource {
    /// `notifications/tools/list_changed` (2025-11-25).
    Notification,
    /// A list-change event delivered over `subscriptions/listen` (2026-07-28).
    Subscription,
}

/// One `tools/list` page as a span reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListPage {
    /// The cursor the request sent; `None` for the first page.
    pub cursor: Option<Box<str>>,
    /// The result carried a non-null `nextCursor`.
    pub next_cursor_present: bool,
    /// The digest of each tool on the page (`name`, `sha256:…`).
    pub tools: Vec<(Arc<str>, Arc<str>)>,
    /// 2026-07-28 `ttlMs` of the result.
    pub ttl_ms: Option<u64>,
    /// 2026-07-28 `cacheScope`.
    pub cache_scope: Option<Arc<str>>,
}

/// Where a `subscriptions/listen` stream (2026-07-28) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenState {
    /// The client sent the listen request.
    Opened,
    /// The server acknowledged it: from here on, the change kinds it honoured are delivered.
    Acknowledged,
    /// The stream ended (cancelled, answered, or its connection closed).
    Closed,
}

impl ListenState {
    pub fn parse(s: &str) -> Option<ListenState> {
        Some(match s {
            "opened" => ListenState::Opened,
            "acknowledged" => ListenState::Acknowledged,
            "closed" => ListenState::Closed,
            _ => return None,
        })
    }
}

/// A `subscriptions/listen` stream event as a span reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListenFacts {
    pub state: ListenState,
    /// The stream carries (or was asked to carry) tool-list changes.
    pub tools_list_changed: bool,
}

/// Catalog facts one span carried.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CatalogFacts {
    /// A list-change signal received at the span's end time.
    pub signal: Option<SignalSource>,
    pub page: Option<ListPage>,
    /// The digest of the registry the client installed (and now chooses tools from).
    pub installed_digest: Option<Arc<str>>,
    /// The server's `tools.listChanged` capability, from `initialize` / `server/discover`.
    pub list_changed_capability: Option<bool>,
    /// Raw tool definitions were present (they were digested; the raw text is stripped before
    /// anything is passed on).
    pub raw_definitions_seen: bool,
    /// The digest of the tool definition a call used.
    pub tool_digest: Option<Arc<str>>,
    /// A `subscriptions/listen` stream event.
    pub listen: Option<ListenFacts>,
}

impl CatalogFacts {
    pub fn is_empty(&self) -> bool {
        self.signal.is_none()
            && self.page.is_none()
            && self.installed_digest.is_none()
            && self.list_changed_capability.is_none()
            && self.tool_digest.is_none()
            && self.listen.is_none()
    }
}
