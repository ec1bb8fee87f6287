//! `snapshot export NAME -o FILE` and `snapshot import FILE [--name N]`: a snapshot as one
//! portable archive (docs/snapshot-archive.md), streamed to or from the server's resource API
//! with a byte counter on a terminal. An export is written beside FILE and renamed into place
//! once complete, so a failed one leaves no partial FILE; an import without `--name` takes the
//! name the archive's manifest gives.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use futures::StreamExt;
use reqwest::Method;

use super::client::{encode, Client, ClientError, Connection};
use super::util::bytes;
use super::{emit, CliError};
use crate::api::resources::PREFIX;
use crate::snapshot_archive::{Manifest, MANIFEST_NAME, MAX_MANIFEST_BYTES};

#[derive(Subcommand, Debug)]
pub enum SnapshotAction {
    /// Write a Ready snapshot as one archive file (`-o -` for standard output).
    #[command(after_help = "Example:
  agent-sandbox snapshot export snap-1 -o snap-1.tar")]
    Export(ExportArgs),
    /// Create a snapshot from an archive made by `snapshot export`.
    #[command(after_help = "Example:
  agent-sandbox snapshot import snap-1.tar --name snap-1-copy")]
    Import(ImportArgs),
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The snapshot to export.
    pub name: String,
    /// Where to write the archive.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The archive to import.
    pub file: PathBuf,
    /// The new snapshot's name (default: the name in the archive's manifest).
    #[arg(long)]
    pub name: Option<String>,
}

pub async fn run(action: SnapshotAction, connection: &Connection) -> Result<ExitCode, CliError> {
    let client = Client::new(connection)?;
    match action {
        SnapshotAction::Export(args) => export(&client, args).await,
        SnapshotAction::Import(args) => import(&client, args).await,
    }
}

async fn export(client: &Client, args: ExportArgs) -> Result<ExitCode, CliError> {
    let path = format!("{PREFIX}/snapshots/{}/export", encode(&args.name));
    let response = client.send(client.request(Method::GET, &path)).await?;
    let total = response.content_length();
    let to_stdout = args.output.as_os_str() == "-";
    let temp = partial_path(&args.output);
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let file = std::fs::File::create(&temp)
            .map_err(|e| CliError::Failed(format!("{}: {e}", temp.display())))?;
        Box::new(std::io::BufWriter::new(file))
    };
    let mut counter = Counter::new("exporting", total);
    let mut stream = response.bytes_stream();
    let written = async {
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(|e| client.unreachable(&e))?;
            out.write_all(&piece)
                .map_err(|e| CliError::Failed(format!("writing the archive: {e}")))?;
            counter.add(piece.len() as u64);
        }
        out.flush()
            .map_err(|e| CliError::Failed(format!("writing the archive: {e}")))?;
        if total.is_some_and(|total| counter.done != total) {
            return Err(CliError::Failed(format!(
                "the server sent {} of {} bytes",
                counter.done,
                total.unwrap_or(0)
            )));
        }
        Ok::<(), CliError>(())
    }
    .await;
    drop(out);
    counter.finish();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(error);
    }
    if !to_stdout {
        std::fs::rename(&temp, &args.output)
            .map_err(|e| CliError::Failed(format!("{}: {e}", args.output.display())))?;
        emit(&format!(
            "snapshot/{} exported to {} ({})\n",
            args.name,
            args.output.display(),
            bytes(counter.done)
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// Where an export is written until it is complete.
fn partial_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    output.with_file_name(name)
}

async fn import(client: &Client, args: ImportArgs) -> Result<ExitCode, CliError> {
    let failed = |e: std::io::Error| CliError::Failed(format!("{}: {e}", args.file.display()));
    let name = match args.name {
        Some(name) => name,
        None => manifest_name(&args.file)?,
    };
    let file = tokio::fs::File::open(&args.file).await.map_err(failed)?;
    let total = file.metadata().await.map_err(failed)?.len();
    let counter = std::sync::Arc::new(std::sync::Mutex::new(Counter::new(
        "importing",
        Some(total),
    )));
    let counting = std::sync::Arc::clone(&counter);
    let stream =
        tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).inspect(move |piece| {
            if let Ok(piece) = piece {
                counting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add(piece.len() as u64);
            }
        });
    let path = format!("{PREFIX}/snapshots/import?name={}", encode(&name));
    let request = client
        .request(Method::POST, &path)
        .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
        .header(reqwest::header::CONTENT_LENGTH, total)
        .body(reqwest::Body::wrap_stream(stream));
    let sent = client.send(request).await;
    counter.lock().unwrap_or_else(|e| e.into_inner()).finish();
    let created: serde_json::Value = sent?
        .json()
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    let status = &created["status"];
    emit(&format!(
        "snapshot/{name} imported ({}, {})\n",
        bytes(status["sizeBytes"].as_u64().unwrap_or(0)),
        status["digest"].as_str().unwrap_or("no digest")
    ));
    Ok(ExitCode::SUCCESS)
}

/// The snapshot name the manifest of the archive at `path` gives.
fn manifest_name(path: &Path) -> Result<String, CliError> {
    let failed = |e: String| {
        CliError::Failed(format!(
            "{}: not a snapshot archive ({e}); give --name to let the server say why",
            path.display()
        ))
    };
    let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    let mut archive = tar::Archive::new(file);
    let mut entries = archive.entries().map_err(|e| failed(e.to_string()))?;
    let mut first = entries
        .next()
        .ok_or_else(|| failed("it is empty".into()))?
        .map_err(|e| failed(e.to_string()))?;
    if first.path_bytes().as_ref() != MANIFEST_NAME.as_bytes() {
        return Err(failed(format!("it does not begin with {MANIFEST_NAME}")));
    }
    let mut text = Vec::new();
    (&mut first)
        .take(MAX_MANIFEST_BYTES)
        .read_to_end(&mut text)
        .map_err(|e| failed(e.to_string()))?;
    let manifest = Manifest::parse(&text, u64::MAX).map_err(|e| failed(e.to_string()))?;
    Ok(manifest.snapshot.name)
}

/// A byte counter redrawn in place on a terminal's stderr, at most a few times a second;
/// silent anywhere else.
struct Counter {
    what: &'static str,
    total: Option<u64>,
    done: u64,
    terminal: bool,
    drawn: Option<Instant>,
}

impl Counter {
    fn new(what: &'static str, total: Option<u64>) -> Counter {
        Counter {
            what,
            total,
            done: 0,
            terminal: std::io::stderr().is_terminal(),
            drawn: None,
        }
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if self.terminal
            && self
                .drawn
                .is_none_or(|at| at.elapsed() >= Duration::from_millis(200))
        {
            self.draw();
        }
    }

    fn line(&self) -> String {
        match self.total {
            Some(total) if total > 0 => format!(
                "{} {} of {} ({}%)",
                self.what,
                bytes(self.done),
                bytes(total),
                self.done.saturating_mul(100) / total
            ),
            _ => format!("{} {}", self.what, bytes(self.done)),
        }
    }

    fn draw(&mut self) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{}", self.line());
        let _ = err.flush();
        self.drawn = Some(Instant::now());
    }

    fn finish(&mut self) {
        if self.terminal && self.drawn.is_some() {
            self.draw();
            let _ = writeln!(std::io::stderr().lock());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_says_how_far() {
        let mut counter = Counter::new("exporting", Some(4096));
        counter.terminal = false;
        counter.add(1024);
        assert_eq!(
            counter.line(),
            format!("exporting {} of {} (25%)", bytes(1024), bytes(4096))
        );
        let mut open = Counter::new("importing", None);
        open.terminal = false;
        open.add(10);
        assert_eq!(open.line(), format!("importing {}", bytes(10)));
    }

    #[test]
    fn an_export_is_written_beside_its_file() {
        assert_eq!(
            partial_path(Path::new("/tmp/a/s.tar")),
            PathBuf::from("/tmp/a/s.tar.partial")
        );
    }
}
