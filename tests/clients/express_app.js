// An Express application behind tollgate in tests/real_clients.rs:
//
//   node express_app.js PORT
//
// GET /hello (after any prefix) answers "hello"; POST /upload reads the whole body and answers its length;
// POST /early413 answers 413 from the declared Content-Length, before reading the upload, and
// POST /early401 answers 401 the same way (Node reads and discards the unread rest itself).
// Prints "listening" once it accepts connections.
"use strict";

const express = require("express");

const LIMIT = 1024 * 1024;
const app = express();

app.get(/\/hello$/, (req, res) => res.type("text").send("hello\n"));

app.post("/upload", express.raw({ type: () => true, limit: "64mb" }), (req, res) => {
  res.json({ length: req.body.length });
});

app.post("/early413", (req, res) => {
  if (Number(req.headers["content-length"] || 0) > LIMIT) {
    res.status(413).type("text").send("too large for express\n");
    return;
  }
  req.resume();
  req.on("end", () => res.type("text").send("ok\n"));
});

app.post("/early401", (req, res) => {
  res.status(401).set("WWW-Authenticate", "Bearer").type("text").send("log in first\n");
});

const server = app.listen(Number(process.argv[2]), "127.0.0.1", () => {
  console.log("listening");
});
server.keepAliveTimeout = 65000;
