//! idem-tui: the operator console of an idem guard.
//!
//! It talks to the admin API (`idem serve`, `idem demo`) and shows, live,
//! the keys and their leases, the store faults (which it can flip), and the
//! guard's decisions. The binary is a thin shell over [`run`]; `idem demo`
//! calls [`run`] too.
//!
//! The parts: [`app`] holds the state and its one transition `App::update`
//! (no I/O), [`action`] maps key presses to actions, [`ui`] draws the state
//! (`impl Widget for &App`), and [`client`] talks to the server and feeds
//! the state through a channel.

pub mod action;
pub mod api;
pub mod app;
pub mod client;
pub mod ui;

use crate::action::{Action, from_key};
use crate::app::App;
use crate::client::{Client, Session};
use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the screen is redrawn when nothing happens, so that leases
/// count down smoothly between polls.
const FRAME: Duration = Duration::from_millis(250);

/// Runs the console on this terminal until the operator quits.
///
/// `admin_url` is the admin listener (`http://127.0.0.1:9090`), `token` its
/// bearer token if it needs one. The terminal is restored however this
/// ends: quit, error, or panic. A server that cannot be reached is not an
/// error: the console shows it and keeps retrying.
pub async fn run(admin_url: &str, token: Option<String>) -> io::Result<()> {
    let client = Client::new(admin_url, token)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let _restore = RestoreOnDrop;
    let mut terminal = ratatui::try_init()?;
    let size = terminal.size()?;
    let mut app = App::new(admin_url, local_ms(), (size.width, size.height));
    let mut session = Session::start(client, app.keys.query.clone());
    let result = event_loop(&mut terminal, &mut app, &mut session).await;
    session.shutdown().await;
    result
}

/// Leaves raw mode and the alternate screen and shows the cursor — also
/// when `run` unwinds from a panic or returns early with an error.
struct RestoreOnDrop;

impl Drop for RestoreOnDrop {
    fn drop(&mut self) {
        ratatui::restore();
        let _ = crossterm::execute!(io::stdout(), crossterm::cursor::Show);
    }
}

fn local_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    session: &mut Session,
) -> io::Result<()> {
    let mut events = EventStream::new();
    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let send = |session: &Session, commands: Vec<app::Command>| {
        for command in commands {
            // The command task only stops when the session does.
            let _ = session.commands.send(command);
        }
    };
    send(session, app.start());
    loop {
        terminal.draw(|f| f.render_widget(&*app, f.area()))?;
        let action = tokio::select! {
            _ = frame.tick() => Action::Tick { local_ms: local_ms() },
            Some(update) = session.updates.recv() => {
                // Apply everything already waiting, then draw once.
                send(session, app.update(Action::Server(update)));
                while let Ok(update) = session.updates.try_recv() {
                    send(session, app.update(Action::Server(update)));
                }
                continue;
            }
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) => match from_key(app, key) {
                    Some(action) => action,
                    None => continue,
                },
                Some(Ok(Event::Resize(width, height))) => Action::Resize { width, height },
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
        };
        send(session, app.update(action));
        if app.should_quit {
            return Ok(());
        }
    }
}
