# The server the ports tests run inside a sandbox (python3, standard library only), on the port
# given as argv[1]:
#   GET  /hello            -> "hello from PORT"
#   GET  /headers          -> the request's headers as a JSON object (lists for repeats)
#   GET  /bytes?n=N        -> N bytes, streamed in 64 KiB chunks (no Content-Length)
#   GET  /endless          -> bytes until the client goes; then /tmp/endless-PORT says "stopped"
#   POST /count            -> the number of body bytes received and their sum mod 2**32
#   GET  /ws               -> a WebSocket that echoes every message back
#   GET  /kib              -> 1 KiB, with Content-Length (for the benchmark)
#   GET  /peer             -> the client's port as this server sees it
# Every request's headers are appended to /tmp/headers-PORT.log as one JSON line.
import base64, hashlib, json, os, socket, struct, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
CHUNK = b"x" * 65536


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self):
        with open(f"/tmp/headers-{PORT}.log", "a") as f:
            f.write(json.dumps([self.path, list(self.headers.items())]) + "\n")

    def reply(self, body, status=200, ctype="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunked(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def do_GET(self):
        self.record()
        path, _, query = self.path.partition("?")
        if path == "/hello":
            self.reply(f"hello from {PORT}".encode())
        elif path == "/peer":
            self.reply(str(self.client_address[1]).encode())
        elif path == "/kib":
            self.reply(b"k" * 1024)
        elif path == "/headers":
            seen = {}
            for k, v in self.headers.items():
                seen.setdefault(k.lower(), []).append(v)
            self.reply(json.dumps(seen).encode(), ctype="application/json")
        elif path == "/bytes":
            n = int(query.split("=", 1)[1])
            self.chunked()
            while n > 0:
                part = CHUNK[: min(n, len(CHUNK))]
                self.chunk(part)
                n -= len(part)
            self.wfile.write(b"0\r\n\r\n")
        elif path == "/endless":
            self.chunked()
            try:
                while True:
                    self.chunk(CHUNK)
            except OSError:
                with open(f"/tmp/endless-{PORT}", "w") as f:
                    f.write("stopped")
                self.close_connection = True
        elif path == "/ws":
            self.websocket()
        else:
            self.reply(b"no such page", status=404)

    def do_POST(self):
        self.record()
        n, total = int(self.headers.get("Content-Length", "0")), 0
        got, s = 0, 0
        while got < n:
            data = self.rfile.read(min(65536, n - got))
            if not data:
                break
            got += len(data)
            s = (s + sum(data)) % (1 << 32)
        self.reply(json.dumps({"bytes": got, "sum": s}).encode(), ctype="application/json")

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        ).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            opcode, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if opcode == 8:
                w.write(b"\x88\x00")
                w.flush()
                self.close_connection = True
                return
            if n < 126:
                w.write(bytes([0x80 | opcode, n]) + data)
            elif n < 65536:
                w.write(bytes([0x80 | opcode, 126]) + struct.pack(">H", n) + data)
            else:
                w.write(bytes([0x80 | opcode, 127]) + struct.pack(">Q", n) + data)
            w.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", PORT), Handler).serve_forever()
