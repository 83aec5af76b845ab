package judge;

import com.alicloud.openservices.tablestore.ClientException;
import com.alicloud.openservices.tablestore.TableStoreException;
import com.alicloud.openservices.tablestore.TunnelClient;
import com.alicloud.openservices.tablestore.model.Column;
import com.alicloud.openservices.tablestore.model.ColumnValue;
import com.alicloud.openservices.tablestore.model.PrimaryKeyColumn;
import com.alicloud.openservices.tablestore.model.PrimaryKeyValue;
import com.alicloud.openservices.tablestore.model.RecordColumn;
import com.alicloud.openservices.tablestore.model.RecordSequenceInfo;
import com.alicloud.openservices.tablestore.model.StreamRecord;
import com.alicloud.openservices.tablestore.model.tunnel.ChannelInfo;
import com.alicloud.openservices.tablestore.model.tunnel.CreateTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.DescribeTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.DescribeTunnelResponse;
import com.alicloud.openservices.tablestore.model.tunnel.ListTunnelRequest;
import com.alicloud.openservices.tablestore.model.tunnel.StartOffsetFlag;
import com.alicloud.openservices.tablestore.model.tunnel.StreamTunnelConfig;
import com.alicloud.openservices.tablestore.model.tunnel.TunnelInfo;
import com.alicloud.openservices.tablestore.model.tunnel.TunnelType;
import com.alicloud.openservices.tablestore.tunnel.worker.IChannelProcessor;
import com.alicloud.openservices.tablestore.tunnel.worker.ProcessRecordsInput;
import com.alicloud.openservices.tablestore.tunnel.worker.TunnelWorker;
import com.alicloud.openservices.tablestore.tunnel.worker.TunnelWorkerConfig;

import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The official Tablestore Java SDK's tunnel client against a Tunnel endpoint, one JSON line per
 * finding on stdout (the SDK's own log goes to stderr).
 *
 * <p>Options ({@code --name value}, or the environment variable in brackets): endpoint
 * (TABLESTORE_ENDPOINT), instance (TABLESTORE_INSTANCE), key-id (TABLESTORE_ACCESS_KEY_ID),
 * key-secret (TABLESTORE_ACCESS_KEY_SECRET), table (TABLESTORE_TABLE), tunnel (default
 * "java-judge"), type (Stream or BaseAndStream, default Stream), records (how many records to
 * read, default 1), timeout (seconds, default 120).
 *
 * <p>In order: a client with a wrong secret calls ListTunnel ("bad_key": the SDK's error code);
 * CreateTunnel (a Stream tunnel from the earliest change), ListTunnel, DescribeTunnel; then a
 * TunnelWorker with an IChannelProcessor prints each record it is handed ("record") until
 * {@code records} have been read ("done", then DescribeTunnel again: "describe_after"; exit 0) or
 * the timeout passes ("timeout", exit 3).
 * An SDK error in the admin calls is an "error" line and exit 4; bad options exit 2.
 */
public final class Judge {
    private Judge() {
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts;
        try {
            opts = options(args);
        } catch (IllegalArgumentException e) {
            System.err.println("usage: judge.Judge --endpoint URL --instance NAME --key-id ID "
                    + "--key-secret SECRET --table NAME [--tunnel NAME] [--type Stream|BaseAndStream] "
                    + "[--records N] [--timeout S]: "
                    + e.getMessage());
            System.exit(2);
            return;
        }
        String endpoint = opts.get("endpoint");
        String instance = opts.get("instance");
        String keyId = opts.get("key-id");
        String secret = opts.get("key-secret");
        String table = opts.get("table");
        String tunnelName = opts.get("tunnel");
        int wanted = Integer.parseInt(opts.get("records"));
        long timeoutSec = Long.parseLong(opts.get("timeout"));

        badKey(endpoint, keyId, secret + "-wrong", instance, table);

        TunnelClient client = new TunnelClient(endpoint, keyId, secret, instance);
        String tunnelId;
        try {
            tunnelId = admin(client, table, tunnelName, TunnelType.valueOf(opts.get("type")));
        } catch (TableStoreException e) {
            emit("{\"event\":\"error\",\"error_code\":" + str(e.getErrorCode())
                    + ",\"http_status\":" + e.getHttpStatus() + ",\"message\":" + str(e.getMessage()) + "}");
            client.shutdown();
            System.exit(4);
            return;
        }

        CountDownLatch enough = new CountDownLatch(1);
        AtomicInteger read = new AtomicInteger();
        IChannelProcessor printer = new IChannelProcessor() {
            @Override
            public void process(ProcessRecordsInput input) {
                for (StreamRecord record : input.getRecords()) {
                    emit(recordJson(input.getChannelId(), record));
                    if (read.incrementAndGet() >= wanted) {
                        enough.countDown();
                    }
                }
            }

            @Override
            public void shutdown() {
            }
        };
        TunnelWorkerConfig config = new TunnelWorkerConfig(printer);
        config.setHeartbeatIntervalInSec(5);  // the SDK's least: new and split channels sooner
        config.setHeartbeatTimeoutInSec(60);
        config.setCheckpointIntervalInMillis(1000);
        TunnelWorker worker = new TunnelWorker(tunnelId, client, config);
        int exit;
        try {
            worker.connectAndWorking();
            boolean done = enough.await(timeoutSec, TimeUnit.SECONDS);
            emit("{\"event\":\"" + (done ? "done" : "timeout") + "\",\"records\":" + read.get() + "}");
            if (done) {
                emit("{\"event\":\"describe_after\",\"channels\":"
                        + channelsJson(client.describeTunnel(new DescribeTunnelRequest(table, tunnelName))) + "}");
            }
            exit = done ? 0 : 3;
        } finally {
            worker.shutdown();
            config.shutdown();
            client.shutdown();
        }
        System.exit(exit);
    }

    /** A client with a wrong secret: the SDK's refusal, by its error code. */
    private static void badKey(String endpoint, String keyId, String wrongSecret, String instance, String table) {
        TunnelClient bad = new TunnelClient(endpoint, keyId, wrongSecret, instance);
        try {
            bad.listTunnel(new ListTunnelRequest(table));
            emit("{\"event\":\"bad_key\",\"refused\":false}");
        } catch (TableStoreException e) {
            emit("{\"event\":\"bad_key\",\"refused\":true,\"error_code\":" + str(e.getErrorCode())
                    + ",\"http_status\":" + e.getHttpStatus() + ",\"message\":" + str(e.getMessage()) + "}");
        } catch (ClientException e) {
            emit("{\"event\":\"bad_key\",\"refused\":true,\"error_code\":null,\"client_error\":"
                    + str(e.getMessage()) + "}");
        } finally {
            bad.shutdown();
        }
    }

    /** CreateTunnel, ListTunnel, DescribeTunnel: returns the tunnel's id. */
    private static String admin(TunnelClient client, String table, String tunnelName, TunnelType type) {
        CreateTunnelRequest create = new CreateTunnelRequest(table, tunnelName, type);
        if (type == TunnelType.Stream) {  // from the earliest change held, not from now
            create.setStreamTunnelConfig(new StreamTunnelConfig(StartOffsetFlag.EARLIEST));
        }
        String tunnelId = client.createTunnel(create).getTunnelId();
        emit("{\"event\":\"create\",\"tunnel_id\":" + str(tunnelId) + "}");

        List<String> listed = new ArrayList<>();
        for (TunnelInfo info : client.listTunnel(new ListTunnelRequest(table)).getTunnelInfos()) {
            listed.add(tunnelJson(info));
        }
        emit("{\"event\":\"list\",\"tunnels\":" + listed + "}");

        DescribeTunnelResponse described = client.describeTunnel(new DescribeTunnelRequest(table, tunnelName));
        emit("{\"event\":\"describe\",\"tunnel\":" + tunnelJson(described.getTunnelInfo())
                + ",\"channels\":" + channelsJson(described) + "}");
        return tunnelId;
    }

    private static String channelsJson(DescribeTunnelResponse described) {
        List<String> channels = new ArrayList<>();
        for (ChannelInfo channel : described.getChannelInfos()) {
            channels.add("{\"id\":" + str(channel.getChannelId())
                    + ",\"type\":" + str(String.valueOf(channel.getChannelType()))
                    + ",\"status\":" + str(String.valueOf(channel.getChannelStatus())) + "}");
        }
        return channels.toString();
    }

    private static String tunnelJson(TunnelInfo info) {
        return "{\"name\":" + str(info.getTunnelName()) + ",\"id\":" + str(info.getTunnelId())
                + ",\"type\":" + str(String.valueOf(info.getTunnelType()))
                + ",\"table\":" + str(info.getTableName())
                + ",\"instance\":" + str(info.getInstanceName())
                + ",\"stage\":" + str(String.valueOf(info.getStage()))
                + ",\"expired\":" + info.isExpired()
                + ",\"create_time_ms\":" + info.getCreateTime() + "}";
    }

    /** One record as the SDK decoded it: type, primary key, columns (with their operation), sequence. */
    private static String recordJson(String channelId, StreamRecord record) {
        StringBuilder out = new StringBuilder("{\"event\":\"record\",\"channel\":").append(str(channelId));
        out.append(",\"type\":").append(str(record.getRecordType().name()));
        out.append(",\"pk\":[");
        PrimaryKeyColumn[] pk = record.getPrimaryKey().getPrimaryKeyColumns();
        for (int i = 0; i < pk.length; i++) {
            out.append(i > 0 ? "," : "").append("[").append(str(pk[i].getName())).append(",")
                    .append(pkValue(pk[i].getValue())).append("]");
        }
        out.append("],\"columns\":[");
        List<RecordColumn> columns = record.getColumns();
        for (int i = 0; i < columns.size(); i++) {
            Column column = columns.get(i).getColumn();
            out.append(i > 0 ? "," : "").append("{\"name\":").append(str(column.getName()))
                    .append(",\"op\":").append(str(columns.get(i).getColumnType().name()))
                    .append(",\"value\":").append(value(column.getValue()))
                    .append(",\"ts\":").append(column.hasSetTimestamp() ? Long.toString(column.getTimestamp()) : "null")
                    .append("}");
        }
        out.append("]");
        RecordSequenceInfo seq = record.getSequenceInfo();
        if (seq != null) {
            out.append(",\"seq\":{\"epoch\":").append(seq.getEpoch())
                    .append(",\"timestamp\":").append(seq.getTimestamp())
                    .append(",\"row_index\":").append(seq.getRowIndex()).append("}");
        }
        return out.append("}").toString();
    }

    private static String value(ColumnValue v) {
        if (v == null) {
            return "null";
        }
        switch (v.getType()) {
            case INTEGER:
                return Long.toString(v.asLong());
            case DOUBLE:
                return Double.toString(v.asDouble());
            case BOOLEAN:
                return Boolean.toString(v.asBoolean());
            case STRING:
                return str(v.asString());
            case BINARY:
                return "{\"base64\":" + str(Base64.getEncoder().encodeToString(v.asBinary())) + "}";
            default:
                return str(String.valueOf(v));
        }
    }

    private static String pkValue(PrimaryKeyValue v) {
        switch (v.getType()) {
            case INTEGER:
                return Long.toString(v.asLong());
            case STRING:
                return str(v.asString());
            case BINARY:
                return "{\"base64\":" + str(Base64.getEncoder().encodeToString(v.asBinary())) + "}";
            default:
                return str(String.valueOf(v));
        }
    }

    /** A JSON string (or null). */
    private static String str(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append("\"").toString();
    }

    private static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static Map<String, String> options(String[] args) {
        Map<String, String> opts = new HashMap<>();
        opts.put("tunnel", "java-judge");
        opts.put("type", "Stream");
        opts.put("records", "1");
        opts.put("timeout", "120");
        String[][] fromEnv = {
            {"endpoint", "TABLESTORE_ENDPOINT"}, {"instance", "TABLESTORE_INSTANCE"},
            {"key-id", "TABLESTORE_ACCESS_KEY_ID"}, {"key-secret", "TABLESTORE_ACCESS_KEY_SECRET"},
            {"table", "TABLESTORE_TABLE"},
        };
        for (String[] pair : fromEnv) {
            String value = System.getenv(pair[1]);
            if (value != null && !value.isEmpty()) {
                opts.put(pair[0], value);
            }
        }
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value, got " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : new String[] {"endpoint", "instance", "key-id", "key-secret", "table"}) {
            if (!opts.containsKey(required)) {
                throw new IllegalArgumentException("missing --" + required);
            }
        }
        try {
            TunnelType.valueOf(opts.get("type"));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("--type must be Stream or BaseAndStream");
        }
        for (String number : new String[] {"records", "timeout"}) {
            try {
                Long.parseLong(opts.get(number));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("--" + number + " must be a number");
            }
        }
        return opts;
    }
}
