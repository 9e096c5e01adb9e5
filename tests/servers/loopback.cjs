// Preload for third-party Node servers that listen on every interface: force 127.0.0.1.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args[0] !== null && typeof args[0] === "object") {
    args[0] = { ...args[0], host: "127.0.0.1" };
  } else if (typeof args[0] === "number" || typeof args[0] === "string") {
    if (typeof args[1] === "string") args[1] = "127.0.0.1";
    else args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
