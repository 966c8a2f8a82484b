//! idem-tui: the operator console of an idem guard.
//!
//! It talks to the admin API (`idem serve`, `idem demo`) and shows, live,
//! the keys and their leases, the store faults (which it can flip), and the
//! guard's decisions. The binary is a thin shell over [`run`]; `idem demo`
//! calls [`run`] too.
//!
//! The library's API is what those two callers need: [`run`],
//! [`run_with_banner`], [`token_from`] and [`check_admin_url`]. The parts
//! are private: `protocol` is what the admin client (`client`) and the
//! state (`app`) tell each other; `views` holds the three views, each with
//! its state, update, key table and rendering; `action` maps key presses to
//! actions through the views' tables; `ui` draws the frame around the view
//! on screen (`impl Widget for &App`). Their tests are in the crate
//! (`src/tests/`); `tests/it/` drives the binary in a pseudo-terminal.

mod action;
mod api;
mod app;
mod client;
mod format;
mod keymap;
mod protocol;
#[cfg(test)]
mod tests;
mod theme;
mod ui;
mod views;

use crate::action::{Action, from_key};
use crate::app::App;
use crate::client::{Client, Session};
use crate::protocol::Command;
use crossterm::event::{Event, EventStream};
use futures_util::StreamExt;
use std::io;
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

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
    let (_keep, banner) = watch::channel(None);
    run_with_banner(admin_url, token, banner).await
}

/// [`run`], with a line the embedding program can show above the view at
/// any time — `idem demo` says there when its run is over.
pub async fn run_with_banner(
    admin_url: &str,
    token: Option<String>,
    banner: watch::Receiver<Option<String>>,
) -> io::Result<()> {
    let has_token = token.as_ref().is_some_and(|t| !t.is_empty());
    let client = Client::new(admin_url, token).map_err(invalid_url)?;
    let _restore = RestoreOnDrop;
    let mut terminal = ratatui::try_init()?;
    let mut app = App::new(admin_url, local_ms());
    app.has_token = has_token;
    let mut session = Session::start(client, app.keys.query.clone());
    let result = event_loop(&mut terminal, &mut app, &mut session, banner).await;
    session.shutdown().await;
    result
}

/// Whether `admin_url` is an admin listener's URL the console can use, so
/// that a wrong one is named before the terminal is touched. The error is
/// the one [`run`] would return.
pub fn check_admin_url(admin_url: &str) -> io::Result<()> {
    Client::new(admin_url, None).map(drop).map_err(invalid_url)
}

fn invalid_url(e: client::ClientError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
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

/// The admin token from `--token` or `--token-file` (one of them at most):
/// the file's text less one trailing newline. The error names the option.
pub fn token_from(
    token: Option<String>,
    file: Option<&std::path::Path>,
) -> Result<Option<String>, String> {
    match (token, file) {
        (Some(_), Some(file)) => Err(format!(
            "--token (or IDEM_ADMIN_TOKEN) and --token-file (or IDEM_ADMIN_TOKEN_FILE, here {}) both give the admin token; give one",
            file.display()
        )),
        (token, None) => Ok(token),
        (None, Some(file)) => std::fs::read_to_string(file)
            .map(|text| Some(api::token_from_file(&text).to_owned()))
            .map_err(|e| format!("--token-file {}: {e}", file.display())),
    }
}

fn local_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Puts `text` on the terminal's clipboard with OSC 52, which terminals
/// (and tmux with `set-clipboard on`) pass to the system clipboard — over
/// SSH too. A terminal that does not know it ignores it.
fn copy_to_clipboard(text: &str) {
    let mut out = io::stdout();
    let _ = write!(out, "\x1b]52;c;{}\x07", base64(text.as_bytes()));
    let _ = out.flush();
}

/// Standard base64, for OSC 52 (too small a need for a dependency).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    session: &mut Session,
    mut banner: watch::Receiver<Option<String>>,
) -> io::Result<()> {
    let mut events = EventStream::new();
    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut banner_open = true;
    let send = |session: &Session, commands: Vec<Command>| {
        for command in commands {
            match command {
                Command::Copy(text) => copy_to_clipboard(&text),
                // The command task only stops when the session does.
                command => {
                    let _ = session.commands.send(command);
                }
            }
        }
    };
    send(session, app.start());
    loop {
        terminal.draw(|f| f.render_widget(&*app, f.area()))?;
        let action = tokio::select! {
            _ = frame.tick() => Action::Tick { local_ms: local_ms() },
            Some(update) = session.updates.recv() => {
                // Apply everything already waiting, then draw once.
                send(session, app.apply(update));
                while let Ok(update) = session.updates.try_recv() {
                    send(session, app.apply(update));
                }
                continue;
            }
            changed = banner.changed(), if banner_open => {
                match changed {
                    Ok(()) => app.banner.clone_from(&banner.borrow_and_update()),
                    Err(_) => banner_open = false,
                }
                continue;
            }
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) => match from_key(app.mode(), app.view, key) {
                    Some(action) => action,
                    None => continue,
                },
                // A resize is drawn at the top of the loop; the views measure
                // their areas as they draw.
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
