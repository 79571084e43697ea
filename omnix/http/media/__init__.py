"""Decoding the media parts of chat input, once, at admission.

Turns a request's ``image_url`` / ``input_audio`` / ``audio_url`` /
``video_url`` parts (``omnix.http.common.fields.MediaContentPart``) into
arrays a model's processor takes: audio as float32 mono samples resampled
(by omnix, with PyAV's libswresample) to the pipeline's
``MediaLimits.sample_rate``; images as uint8 RGB arrays of shape
``(height, width, 3)`` (PIL; turned upright by its EXIF orientation,
transparency shown over white, an animation's first frame).  Every check
a part must pass happens here, before anything is admitted, and each
failure is an ``ApiError`` 400 whose ``param`` is the part's JSON path
(``messages[0].content[1]``): the kind the pipeline takes, parts per kind,
bytes per part (from the base64 length, before decoding), pixels (from
the image header, before decoding pixels), seconds of audio (from the
container header where it is exact, and on the decoded samples), bad data
of every sort, and where a URL may point.

Where media may come from: ``data:`` URLs and ``input_audio`` base64;
``http(s)`` URLs only of hosts in ``allowed_domains`` (exact host names,
like vLLM's ``--allowed-media-domains``), fetched with aiohttp under a
timeout and the part's byte limit, redirects followed only to allowed
hosts.  Never ``file://``, a local path or any other scheme.

Raw ``pcm16`` audio (``input_audio.format == "pcm16"`` or a
``data:audio/pcm`` URL) is signed 16-bit little-endian mono at 24 kHz
(``PCM16_RATE``: OpenAI's pcm16 rate, and what omnix's own pcm16 output
uses), unless a data URL says otherwise (``data:audio/pcm;rate=16000;...``).

The CPU work (base64, demuxing, decoding, resampling, pixel copies) runs
in a thread pool, off the event loop, and is arranged so that no step
holds the GIL for long.

Modules: ``decoder`` (``MediaDecoder``), ``locate`` (the cheap checks),
``fetch``, ``b64``, ``image``, ``sound``, ``common`` (formats, refusals),
``parts`` (decoded parts as a plan's ``MediaPart``s).  Does not own the
text of the message nor where the arrays are stored.
"""

from omnix.http.media.common import MEDIA_PIPELINE, PCM16_RATE, DecodedMedia
from omnix.http.media.decoder import MediaDecoder

__all__ = ["MEDIA_PIPELINE", "PCM16_RATE", "DecodedMedia", "MediaDecoder"]
