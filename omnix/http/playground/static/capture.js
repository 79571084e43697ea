// The microphone's samples, handed to the page (talk.js) as they come: an
// AudioWorklet runs off the page's thread, so no sample is dropped while
// the page draws.
class Capture extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}

registerProcessor("omnix-capture", Capture);
