"""WS-Topics engine: topic model, dialect parsers, topic namespaces and sets, matching,
and translation of topic expressions to RabbitMQ, MQTT and Kafka patterns.

Pure functions and data: no Flask, no middleware client, no I/O.
"""

from .dialects import (
    CONCRETE,
    DIALECT_ALIASES,
    FULL,
    ONVIF_CONCRETE_SET,
    SIMPLE,
    SUPPORTED_DIALECTS,
    XPATH,
    canonical_dialect,
    is_ncname,
    parse_topic_expression,
    parse_topic_expression_element,
    require_concrete_topic,
)
from .errors import (
    InvalidTopicExpression,
    InvalidTopicNamespace,
    MultipleTopicsSpecified,
    NameNotRepresentable,
    TopicError,
    TopicExpressionDialectUnknown,
    TopicNotSupported,
    TopicSetFull,
)
from .index import TopicIndex
from .model import (
    ANY,
    DEEP,
    PathPattern,
    Segment,
    Topic,
    TopicExpression,
    Wildcard,
    match_segments,
)
from .namespaces import (
    WSTOP_10,
    WSTOP_13,
    QueryExpression,
    TopicDefinition,
    TopicNamespace,
    load_topic_namespace,
)
from .topic_set import TopicSet

__all__ = [
    "ANY",
    "CONCRETE",
    "DEEP",
    "DIALECT_ALIASES",
    "FULL",
    "ONVIF_CONCRETE_SET",
    "SIMPLE",
    "SUPPORTED_DIALECTS",
    "WSTOP_10",
    "WSTOP_13",
    "XPATH",
    "InvalidTopicExpression",
    "InvalidTopicNamespace",
    "MultipleTopicsSpecified",
    "NameNotRepresentable",
    "PathPattern",
    "QueryExpression",
    "Segment",
    "Topic",
    "TopicDefinition",
    "TopicError",
    "TopicExpression",
    "TopicExpressionDialectUnknown",
    "TopicIndex",
    "TopicNamespace",
    "TopicNotSupported",
    "TopicSet",
    "TopicSetFull",
    "Wildcard",
    "canonical_dialect",
    "is_ncname",
    "load_topic_namespace",
    "match_segments",
    "parse_topic_expression",
    "parse_topic_expression_element",
    "require_concrete_topic",
]

from wsnmom.topic_mapping.escaping import (
    decode_segment,
    encode_segment,
    native_word_to_ncname,
    ncname_to_native_word,
)
from wsnmom.topic_mapping.syntax import KAFKA, MQTT, RABBITMQ, WildcardSyntax
from wsnmom.topic_mapping.translate import (
    NamespaceRoots,
    NativeName,
    NativePattern,
    Translation,
    native_to_topic,
    topic_to_native,
    translate,
)

__all__ += [
    "KAFKA",
    "MQTT",
    "RABBITMQ",
    "NamespaceRoots",
    "NativeName",
    "NativePattern",
    "Translation",
    "WildcardSyntax",
    "decode_segment",
    "encode_segment",
    "native_to_topic",
    "native_word_to_ncname",
    "ncname_to_native_word",
    "topic_to_native",
    "translate",
]
