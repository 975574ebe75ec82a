// Starts `hpmoe lsp` for .hpm files. The binary is `hpmoe` on the PATH, or the setting
// `hpmoe.serverPath`.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate() {
  const command = vscode.workspace.getConfiguration("hpmoe").get("serverPath", "hpmoe");
  const server = { command, args: ["lsp"] };
  client = new LanguageClient("hpmoe", "hpmoe", server, {
    documentSelector: [{ scheme: "file", language: "hpm" }, { scheme: "untitled", language: "hpm" }],
  });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
