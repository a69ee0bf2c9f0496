package dev.llmgate.searchnode;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.index.mapper.MapperExtrasPlugin;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * One OpenSearch node on loopback, single-node discovery, for tests.
 *
 * <p>{@code java dev.llmgate.searchnode.Launcher HOME HTTP_PORT}: data and logs under
 * HOME; the node runs until the process gets SIGTERM or SIGINT, then closes (flushing its
 * shards) before the process exits, so a node stopped and started on the same HOME keeps
 * what it had indexed. The distribution's start-up script and bootstrap checks are not
 * used: they are for production hosts (memory lock, file limits), not a test on loopback.
 */
public final class Launcher {
    /** Node's constructor with plugins from the class path is protected: this opens it. */
    private static final class ClasspathNode extends Node {
        ClasspathNode(Environment environment, List<Class<? extends Plugin>> plugins) {
            super(environment, plugins, true);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: Launcher HOME HTTP_PORT");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        Files.createDirectories(home.resolve("data"));
        Files.createDirectories(home.resolve("logs"));
        Settings settings = Settings.builder()
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString())
            .put("cluster.name", "llmgate-tests")
            .put("node.name", "llmgate-tests-0")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", args[1])
            // Any free port for the node-to-node transport, which nothing else uses.
            .put("transport.port", "0")
            // A test machine's disk may well be more than 85% full: without this the node
            // would refuse to allocate shards and stay red.
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .build();
        LogConfigurator.configureWithoutConfig(settings);
        Environment environment =
            InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), null, () -> "llmgate-tests-0");
        Node node = new ClasspathNode(
            environment, List.of(Netty4Plugin.class, CommonAnalysisPlugin.class, MapperExtrasPlugin.class));
        CountDownLatch closed = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                node.close();
                node.awaitClose(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            } finally {
                closed.countDown();
            }
        }));
        node.start();
        System.out.println("search-node: OpenSearch started on http://127.0.0.1:" + args[1]);
        closed.await();
    }
}
