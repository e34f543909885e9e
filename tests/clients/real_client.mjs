// A real Node client for tests/real_clients.rs: the built-in fetch (undici), keep-alive by
// default. Prints one JSON object on stdout.
//
//   node real_client.mjs fetch-upload URL SIZE TRIES
//   node real_client.mjs fetch-keepalive URL COUNT
//
// Each try or request reports {"status": N, ...} or {"error": "name: message (cause)"}.

function failure(error) {
  const cause = error.cause ? ` (${error.cause.code || error.cause.message})` : "";
  return { error: `${error.name}: ${error.message}${cause}` };
}

async function upload(url, size, tries) {
  const body = Buffer.alloc(size, "x");
  const results = [];
  for (let i = 0; i < tries; i++) {
    try {
      const response = await fetch(url, {
        method: "POST",
        body,
        headers: { "content-type": "application/octet-stream" },
      });
      results.push({ status: response.status, body: await response.text() });
    } catch (error) {
      results.push(failure(error));
    }
  }
  return { results };
}

async function keepalive(url, count) {
  const results = [];
  for (let i = 0; i < count; i++) {
    try {
      const response = await fetch(url);
      await response.arrayBuffer();
      results.push({
        status: response.status,
        retry_after: response.headers.get("retry-after"),
      });
    } catch (error) {
      results.push(failure(error));
    }
  }
  return { results };
}

const [command, url, a, b] = process.argv.slice(2);
let out;
if (command === "fetch-upload") {
  out = await upload(url, Number(a), Number(b));
} else if (command === "fetch-keepalive") {
  out = await keepalive(url, Number(a));
} else {
  console.error(`unknown command ${command}`);
  process.exit(2);
}
process.stdout.write(JSON.stringify(out));
