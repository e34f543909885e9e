"""A Flask application served by gunicorn behind tollgate in tests/real_clients.rs:

    gunicorn --bind 127.0.0.1:PORT --chdir tests/clients flask_app:app

GET /hello (after any prefix) answers "hello"; POST /upload reads the whole body and answers its length;
POST /early401 answers 401 without reading the upload (a login check before the body), and
gunicorn's sync worker then closes the connection with the upload unread.
"""

from flask import Flask, request

app = Flask(__name__)


@app.get("/hello")
@app.get("/<path:prefix>/hello")
def hello(prefix=None):
    return "hello\n"


@app.post("/upload")
def upload():
    body = request.get_data(cache=False)
    return {"length": len(body)}


@app.post("/early401")
def early401():
    return "log in first\n", 401, {"WWW-Authenticate": "Bearer"}
