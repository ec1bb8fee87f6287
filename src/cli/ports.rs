//! `port-forward` and `preview`: reaching what listens inside a sandbox from this machine.
//! `port-forward NAME [LOCAL:]REMOTE…` (kubectl's syntax) listens on 127.0.0.1 and carries each
//! accepted connection over its own port-forward WebSocket; `preview NAME PORT` prints a link.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use super::client::{Client, Connection};
use super::{emit, emit_err, CliError};
use crate::api::ports::PORTFORWARD_PROTOCOL;
use crate::resource::Kind;

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox port-forward demo 8000            # 127.0.0.1:8000 -> 8000 in the sandbox
  agent-sandbox port-forward demo 9000:8000 :5432  # a free local port for 5432")]
pub struct PortForwardArgs {
    /// The sandbox.
    pub name: String,
    /// Ports: REMOTE (the same port here), LOCAL:REMOTE, or :REMOTE (a free port here).
    #[arg(required = true)]
    pub ports: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(Args, Debug)]
#[command(after_help = "Examples:
  agent-sandbox preview demo 8000
  agent-sandbox preview demo 8000 --expires 600")]
pub struct PreviewArgs {
    /// The sandbox.
    pub name: String,
    /// The port inside the sandbox.
    pub port: u16,
    /// Seconds the link works (default one hour).
    #[arg(long)]
    pub expires: Option<u64>,
    #[command(flatten)]
    pub connection: Connection,
}

/// `(local, remote)` of one argument; local 0 means a free port.
fn parse_spec(spec: &str) -> Result<(u16, u16), CliError> {
    let bad = || {
        CliError::Usage(format!(
            "{spec:?}: expected REMOTE, LOCAL:REMOTE or :REMOTE, ports 1-65535"
        ))
    };
    let port = |s: &str| s.parse::<u16>().ok().filter(|p| *p != 0);
    match spec.split_once(':') {
        None => port(spec).map(|p| (p, p)).ok_or_else(bad),
        Some(("", remote)) => port(remote).map(|r| (0, r)).ok_or_else(bad),
        Some((local, remote)) => match (port(local), port(remote)) {
            (Some(l), Some(r)) => Ok((l, r)),
            _ => Err(bad()),
        },
    }
}

pub async fn port_forward(args: PortForwardArgs) -> Result<ExitCode, CliError> {
    let client = Arc::new(Client::new(&args.connection)?);
    let specs = args
        .ports
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>, _>>()?;
    if client
        .get_resource(Kind::Sandbox, &args.name)
        .await?
        .is_none()
    {
        return Err(CliError::Failed(format!(
            "sandbox {:?} not found",
            args.name
        )));
    }
    let mut listeners = Vec::new();
    for (local, remote) in specs {
        let listener = TcpListener::bind(("127.0.0.1", local))
            .await
            .map_err(|e| CliError::Failed(format!("cannot listen on 127.0.0.1:{local}: {e}")))?;
        let bound = listener.local_addr().map(|a| a.port()).unwrap_or(local);
        emit(&format!("Forwarding from 127.0.0.1:{bound} -> {remote}\n"));
        listeners.push((listener, remote));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (listener, remote) in listeners {
        let client = Arc::clone(&client);
        let name = args.name.clone();
        tasks.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let client = Arc::clone(&client);
                let name = name.clone();
                tokio::spawn(async move {
                    if let Err(e) = forward(&client, &name, remote, stream).await {
                        emit_err(&format!("error: forwarding to port {remote}: {e}"));
                    }
                });
            }
        });
    }
    let _ = tokio::signal::ctrl_c().await;
    tasks.abort_all();
    Ok(ExitCode::SUCCESS)
}

/// Carries one accepted connection over its own WebSocket until either side ends.
async fn forward(
    client: &Client,
    name: &str,
    remote: u16,
    stream: TcpStream,
) -> Result<(), CliError> {
    let path = format!(
        "{}/portforward?port={remote}",
        Client::resource_path(Kind::Sandbox, Some(&client.key(name)))
    );
    let (socket, _) = client
        .websocket(client.request(Method::GET, &path), PORTFORWARD_PROTOCOL)
        .await?;
    let _ = stream.set_nodelay(true);
    let (mut from_local, mut to_local) = stream.into_split();
    let (mut to_sandbox, mut from_sandbox) = socket.split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from_local.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buf[..n]);
                    if to_sandbox.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_sandbox.send(Message::Close(None)).await;
    };
    let down = async {
        while let Some(Ok(message)) = from_sandbox.next().await {
            match message {
                Message::Binary(bytes) if to_local.write_all(&bytes).await.is_err() => return,
                Message::Close(_) => return,
                _ => {}
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
    Ok(())
}

pub async fn preview(args: PreviewArgs) -> Result<ExitCode, CliError> {
    let client = Client::new(&args.connection)?;
    let mut body = json!({ "port": args.port });
    if let Some(seconds) = args.expires {
        body["expiresInSeconds"] = json!(seconds);
    }
    let path = format!(
        "{}/previews",
        Client::resource_path(Kind::Sandbox, Some(&client.key(&args.name)))
    );
    let answer = client
        .json(client.request(Method::POST, &path).json(&body))
        .await?;
    let url = answer["url"].as_str().unwrap_or_default();
    let expires = answer["expiresAt"].as_str().unwrap_or_default();
    emit(&format!("{url}\n"));
    emit_err(&format!("works until {expires}"));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_follow_kubectl() {
        assert_eq!(parse_spec("8000").unwrap(), (8000, 8000));
        assert_eq!(parse_spec("9000:8000").unwrap(), (9000, 8000));
        assert_eq!(parse_spec(":8000").unwrap(), (0, 8000));
        for bad in ["0", "8000:", "a:8000", "70000", "", "1:2:3"] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
