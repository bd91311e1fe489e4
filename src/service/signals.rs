//! The signals a running service answers: the ones that drain it ([`shutdown_signal`]) and
//! SIGHUP, which reloads it ([`Hangups`]). `serve` and the HTTP-mode tap end on the same set, so
//! no signal that drains one kills the other with work in flight.

/// SIGTERM, SIGINT, SIGQUIT and SIGUSR1 all drain (decide what is in flight, flush, exit): none
/// of them ends the process with chains in flight lost. SIGHUP reloads ([`Hangups`]).
///
/// The handlers are installed when this is called, not when the future is first polled: from
/// then on none of these signals can end the process unhandled. Must be called inside a Tokio
/// runtime.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::quit(), SignalKind::user_defined1()];
        let mut streams: Vec<_> = kinds.into_iter().filter_map(|k| signal(k).ok()).collect();
        async move {
            if streams.is_empty() {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
            futures_any(&mut streams).await
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The first of several signal streams to fire.
#[cfg(unix)]
async fn futures_any(streams: &mut [tokio::signal::unix::Signal]) {
    std::future::poll_fn(|cx| {
        for s in streams.iter_mut() {
            if s.poll_recv(cx).is_ready() {
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// SIGHUP, as a stream the supervisor waits on (never fires where there is no SIGHUP).
pub(crate) struct Hangups {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    pub(crate) fn install() -> Hangups {
        #[cfg(unix)]
        {
            Hangups { hup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok() }
        }
        #[cfg(not(unix))]
        Hangups {}
    }

    pub(crate) async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(h) = &mut self.hup {
            if h.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}
